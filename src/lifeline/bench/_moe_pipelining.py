"""``bench moe --model pipelining-moe``: the MoE rows for examples/pipelining-moe (issue 25).

The recovery rows run the example's own TrainingJob (a ``torch.distributed.pipelining`` MoE of 3
stages under ``Schedule1F1B``, the script ``examples/pipelining-moe/train.py``) instead of the
reference GPT-MoE job, with the same checkpoint interval, failure step and sparse window as the
reference rows. The checkpoint row compares, per stage, the dense state a checkpoint copies
(parameters, AdamW moments and steps: the tensors of ``PipelineTrainer.state()``) with the sparse
slot bytes the sparse run copied per step (median over ranks and steps).
"""

from __future__ import annotations

import copy
import importlib.util
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from lifeline.errors import ConfigError

__all__ = ["EXAMPLE", "pipelining_doc", "pipelining_checkpoint_row"]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pipelining-moe"


@lru_cache(maxsize=1)
def _example_doc() -> dict:
    path = EXAMPLE / "trainingjob.yaml"
    if not path.is_file():
        raise ConfigError(f"--model pipelining-moe runs {path}, which is not there (a source checkout is needed)",
                          field="model")
    return yaml.safe_load(path.read_text())


def pipelining_doc(name: str, *, steps: int, every: int, localized: bool, l2: str, sparse: int,
                   env: dict[str, str]) -> dict:
    """The example's TrainingJob as a recovery row's job: its script by absolute path, ``steps``,
    dense checkpoints every ``every`` steps (only at the end when ``sparse``: W of sparse windows),
    ``localized`` replay on or off, L2 at ``l2``."""
    doc = copy.deepcopy(_example_doc())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    (trainer,) = spec["template"]["spec"]["containers"]
    trainer["command"] = ["python", str(EXAMPLE / "train.py")]
    trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec["steps"] = steps
    spec["checkpoint"]["every"] = steps if sparse else every
    spec["checkpoint"]["persist"] = {"every": steps if sparse else every, "uri": l2}
    if sparse:
        spec["checkpoint"]["sparse"] = {"window": sparse}
    else:
        spec["checkpoint"].pop("sparse", None)
    spec["recovery"]["localizedReplay"] = localized
    return doc


def _dense_bytes() -> list[int]:
    """Tensor bytes of each stage's checkpoint state (the example's model and a stepped AdamW)."""
    import torch

    from lifeline.runtime import StatefulState

    spec = importlib.util.spec_from_file_location("pipelining_moe_example", EXAMPLE / "train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = []
    for index in range(example.STAGES):
        module = example.build_stage(index, 0)
        optim = torch.optim.AdamW(module.parameters(), lr=3e-3)
        values = StatefulState({"model": module, "optim": optim}, rng=False).template(0)
        out.append(sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor)))
    return out


def pipelining_checkpoint_row(recovery: dict[str, Any] | None) -> dict[str, Any]:
    """Dense bytes per stage vs the sparse run's slot bytes per rank and step, and their ratio."""
    dense = _dense_bytes()
    sparse = (recovery or {}).get("localized_sparse") or {}
    slot = sparse.get("slot_bytes_per_rank_step")
    median_dense = statistics.median(dense)
    return {"model": "pipelining-moe", "dense_bytes_per_stage": dense, "window": sparse.get("window"),
            "sparse_slot_bytes_per_rank_step": slot,
            "bytes_reduction": round(median_dense / slot, 3) if slot else None}
