"""``lifeline bench moe``: sparse expert checkpoints, upstream logging and localized recovery (MoEvement).

One JSON object, every peer measured in the same run:

* ``checkpoint`` — per expert count (8, 32, 64 per layer): bytes and copy stall per step, dense vs
  sparse at the same per-step budget (:mod:`lifeline.bench._moe_sparse`; the sparse slots are those
  :func:`lifeline.checkpoint.plan_window` chooses, copied as the sidecar's memcpy would), and at
  fixed windows W = 4, 8, 16, 32 (``by_window``: the budget a faster accelerator step gives).
* ``recovery`` — one failed pipeline stage, localized replay vs global rollback from the same
  checkpoint, with ``lifeline run`` (:mod:`lifeline.bench._moe_recovery`): time to the failure step,
  rank-seconds recomputed, upstream-log bytes and seconds per step.
* ``ettr`` — the ETTR of a 16,384-GPU job at job MTBFs of 10, 20 and 60 minutes and at a measured
  per-GPU MTBF (:mod:`lifeline.bench._moe_ettr`): CheckFreq, Gemini, MoEvement and Lifeline charged
  the same shared costs (this run's step time, state bytes, copy bandwidth and replay pace; the
  detection, restart and rendezvous times of ``recovery_costs``, a ``lifeline bench recovery``
  result, else of the localized recovery row), each differing only in what its design changes
  (:func:`lifeline.control.ettr.ettr_table`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

__all__ = ["run"]


def run(*, experts: tuple[int, ...] = (8, 32, 64), steps: int = 12, fail_step: int = 7, every: int = 4,
        recovery: bool = True, workdir: str | None = None,
        recovery_costs: dict[str, Any] | None = None, model: str = "gpt-moe",
        compute_dtype: str = "bfloat16") -> dict[str, Any]:
    """Run every row (see the module docstring); returns the JSON-ready object.

    ``model``: ``gpt-moe`` (the reference trainer) or ``pipelining-moe`` (examples/pipelining-moe, a
    ``torch.distributed.pipelining`` script: the recovery rows run it, the checkpoint row compares its
    stages' dense state with the sparse run's slot bytes, and no ETTR rows, which are priced for the
    reference model's layer sizes; :mod:`lifeline.bench._moe_pipelining`).

    ``compute_dtype``: the checkpoint rows' model compute dtype, which FROZEN copies are stored in
    (``"bfloat16"``: 2 B/param, MoEvement's pricing, with fp32 FROZEN copies beside; ``"float32"``).

    ``recovery_costs``: a ``lifeline bench recovery`` result whose detection, restart and
    rendezvous times the ETTR rows charge every system (default: the localized recovery row's).
    """
    from lifeline.bench._moe_ettr import ettr_rows
    from lifeline.bench._moe_recovery import recovery_rows
    from lifeline.bench._moe_sparse import checkpoint_rows

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lifeline-bench-moe-"))
    root.mkdir(parents=True, exist_ok=True)
    if model == "pipelining-moe":
        from lifeline.bench._moe_pipelining import pipelining_checkpoint_row

        rows: dict[str, Any] = {"model": model}
        if recovery:
            rows["recovery"] = recovery_rows(root, steps=steps, every=every, fail_step=fail_step, model=model)
        rows["checkpoint"] = pipelining_checkpoint_row(rows.get("recovery"))
        rows["state_dir"] = str(root)
        return rows
    out: dict[str, Any] = {"checkpoint": checkpoint_rows(experts, compute_dtype=compute_dtype)}
    big = [r for r in out["checkpoint"] if r["experts_per_layer"] >= 32]
    at16 = [next((w["bytes_reduction"] for w in r["by_window"] if w["window"] == 16), None) for r in big]
    out["checkpoint_target"] = {
        "target": 4.0,
        "sparse_bytes_reduction_at_32_plus": [r["bytes_reduction"] for r in big],
        "met_at_measured_budget": bool(big) and all(r["bytes_reduction"] >= 4.0 for r in big),
        "sparse_bytes_reduction_at_32_plus_w16": at16,
        "met_at_w16": bool(big) and all(x is not None and x >= 4.0 for x in at16),
    }
    if recovery:
        out["recovery"] = recovery_rows(root, steps=steps, every=every, fail_step=fail_step)
    out["ettr"] = ettr_rows(out["checkpoint"], out.get("recovery"), recovery_costs)
    out["state_dir"] = str(root)
    return out
