"""Acceptance: a plain PyTorch DDP script of one's own (examples/ddp) under ``lifeline run``.

The example's TrainingJob (its template command runs ``examples/ddp/train.py``, which uses only the
public SDK, ``lifeline.runtime.init``/``train``) loses rank 1's node at step 3. The run ends
Succeeded, recovered from memory (the recovery record's tier is L0/L1, not L2), and its final
parameters (the L2 digest) are bit-identical to a failure-free run of the same script's model, data
and optimizer computed in the test's process (one ``lifeline run`` in the test, not two: CI time).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lifeline.launch.summary import state_digest
from lifeline.runtime import StatefulState

from ._jobs import example_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end (still runs in CI)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ddp" / "train.py"
STEPS = 6


def _reference_digest(seed: int, world_size: int = 2) -> str:
    """The failure-free run, in this process: the script's model, data and optimizer, each step's
    gradient the mean of the ranks' as DDP makes it (each rank's divided by the world size, then
    summed: gloo's all-reduce of two ranks is one addition). Checked bit-identical to the script's
    own two-process DDP run when this test was written (6 and 8 steps)."""
    spec = importlib.util.spec_from_file_location("ddp_example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data, model = example.corpus(), example.CharMLP()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
    for step in range(STEPS):
        grads = []
        for rank in range(world_size):
            x, y = example.batch(data, step, rank, world_size, seed)
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads.append([p.grad / world_size for p in model.parameters()])
        for p, *per_rank in zip(model.parameters(), *grads):
            p.grad = sum(per_rank[1:], per_rank[0])
        optim.step()
        sched.step()
    values = StatefulState({"model": model, "optim": optim, "sched": sched}).values(STEPS)
    return state_digest({k: v for k, v in values.items() if isinstance(v, torch.Tensor)})


def test_the_ddp_example_loses_a_node_recovers_from_memory_and_ends_bit_identical(tmp_path):
    doc = example_doc("ddp", STEPS)
    reference = _reference_digest(doc["spec"]["seed"])
    job = write_job(tmp_path / "job.yaml", doc)
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"),
                           "--inject-failure", "node:rank=1:step=3", timeout=240)
    assert summary["phase"] == "Succeeded", summary
    (rec,) = summary["recoveries"]
    assert rec["action"] == "ReplacePods" and rec["ranks"] == [1], rec
    assert rec["tier"] in ("L0", "L1"), f"recovered from {rec['tier']}, not from memory: {rec}"
    events = trainer_events(tmp_path / "state")
    assert any(e["event"] == "restore" and e["rank"] == 1 and e["generation"] == 1 for e in events), \
        "the replacement of rank 1 never restored"
    assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
    assert summary["digest"]["sha256"] == reference, "final parameters differ from the failure-free run"
