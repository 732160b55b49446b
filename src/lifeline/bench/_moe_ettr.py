"""``bench moe``'s ETTR rows: a 16,384-GPU job, every system charged the same measured costs.

One :class:`lifeline.control.ettr.SharedCosts` for every row, from this run and this machine:
the iteration time, one GPU's dense state, the GPU-to-host copy bandwidth (the 32-expert
checkpoint row), the localized replay's pace (the recovery rows: seconds per replayed step over
the step time) and the detection, restart and rendezvous times — from a ``lifeline bench
recovery`` result when one is given (``recovery_costs``: its ``replace_l1`` row), else the
localized recovery's time to the failure step less its replay, charged as restart. Assumed:
the link and storage bandwidths (:data:`NETWORK_BYTES_PER_SECOND`,
:data:`STORAGE_BYTES_PER_SECOND`) and the per-GPU MTBF (:data:`GPU_MTBF_HOURS`, measured on
Llama 3's 16,384 GPUs), from which the job's failure rate follows at 16,384 GPUs.

Rows: CheckFreq, Gemini, MoEvement (:func:`lifeline.control.ettr.modeled_peers`: their designs'
stall, interval, bytes, restore tier and recomputation, from the same inputs, with the window
and slot bytes of the same sparse schedule); ``Lifeline`` (the runtime's default: a dense
checkpoint every step whose copy overlaps the next step, its measured stall) and ``Lifeline
(sparse slots, copied before the next step)`` (the sparse slots' measured stall), both
restoring from a peer and replaying the failed stage only (the survivors wait).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ettr_rows", "measured_recovery_seconds", "GPUS", "GPU_MTBF_HOURS", "NETWORK_BYTES_PER_SECOND",
           "STORAGE_BYTES_PER_SECOND", "RESTART_SECONDS"]

GPUS = 16384
"""The modeled job's GPUs."""
GPU_MTBF_HOURS = 54 * 24 * 16384 / 419
"""One GPU's MTBF, hours (~50,700 h): Llama 3's pre-training saw 419 unexpected interruptions in
54 days on 16,384 GPUs (Llama Team, "The Llama 3 Herd of Models", 2024, §3.3.4), a job MTBF of
~3.1 h at 16,384 GPUs. ``ettr_at_gpu_mtbf``; the 10/20/60-minute rows are stress points."""
NETWORK_BYTES_PER_SECOND = 12.5e9
"""Assumed per-GPU link to a peer's memory left for checkpoint traffic (100 Gb/s)."""
STORAGE_BYTES_PER_SECOND = 1.0e9
"""Assumed per-GPU bandwidth to persistent storage."""
RESTART_SECONDS = 60.0
"""Assumed detection + restart + rendezvous when nothing was measured (``--no-recovery``)."""


def measured_recovery_seconds(recovery: dict[str, Any] | None,
                              recovery_costs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Detection, restart and rendezvous seconds, and where they come from.

    - ``recovery_costs``: a ``lifeline bench recovery`` result (or one of its rows; its
      ``replace_l1`` row first, else ``in_place_l0``): detection = ``detect_seconds`` (else
      ``breakdown.noticed``); rendezvous = the slowest rank's ``join_seconds`` summed (rendezvous,
      barrier, process group, sub-groups); restart = ``breakdown.joined`` - detection - rendezvous.
    - else the ``bench moe`` recovery rows: the localized run's ``to_failure_step_seconds`` less
      its replay (``rank_seconds_recomputed``: one stage replays, so rank-seconds are wall
      seconds), as restart (detection, rendezvous and the restore of a small state lumped in).
    - else :data:`RESTART_SECONDS`, assumed.

    Returns:
        ``{"detection_seconds", "restart_seconds", "rendezvous_seconds", "source"}``.
    """
    if recovery_costs:
        row = recovery_costs.get("replace_l1") or recovery_costs.get("in_place_l0") or recovery_costs
        if isinstance(row, dict) and row.get("breakdown"):
            b = row["breakdown"]
            detect = float(row.get("detect_seconds") or b.get("noticed") or 0.0)
            join = sum(float(v) for v in (row.get("join_seconds") or {}).values() if v is not None)
            joined = b.get("joined")
            restart = max(0.0, float(joined) - detect - join) if joined is not None else 0.0
            return {"detection_seconds": detect, "restart_seconds": restart, "rendezvous_seconds": join,
                    "source": "lifeline bench recovery (replace_l1)" if "replace_l1" in recovery_costs
                    else "lifeline bench recovery"}
    local = (recovery or {}).get("localized") or {}
    if local.get("to_failure_step_seconds"):
        lumped = float(local["to_failure_step_seconds"]) - float(local.get("rank_seconds_recomputed") or 0.0)
        return {"detection_seconds": 0.0, "restart_seconds": max(0.0, lumped), "rendezvous_seconds": 0.0,
                "source": "bench moe localized recovery, lumped (to failure step - replay)"}
    return {"detection_seconds": 0.0, "restart_seconds": RESTART_SECONDS, "rendezvous_seconds": 0.0,
            "source": "assumed"}


def _replay_pace(recovery: dict[str, Any] | None, stages: int) -> tuple[float, str]:
    """Seconds per replayed step over the step time, of the localized run; else ``m / (m + p - 1)``."""
    from lifeline.bench._moe_recovery import MODEL
    from lifeline.control.ettr import pipeline_replay_pace

    local = (recovery or {}).get("localized") or {}
    steps, seconds = local.get("rank_steps_recomputed"), local.get("rank_seconds_recomputed")
    step = local.get("step_seconds")
    if steps and seconds and step:
        return min(1.0, max(1e-6, float(seconds) / int(steps) / float(step))), "measured (localized replay)"
    return pipeline_replay_pace(stages, int(MODEL["micro_batches"])), "m / (m + p - 1)"


def ettr_rows(checkpoint: list[dict[str, Any]], recovery: dict[str, Any] | None,
              recovery_costs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ETTR table (see the module docstring) from the 32-expert checkpoint row (else the largest).

    Returns:
        :func:`lifeline.control.ettr.ettr_table`'s object plus ``assumptions`` (inputs not
        measured here), ``measured`` (the recovery costs and replay pace, with their sources)
        and ``target`` (Lifeline's ETTR at a 10-minute MTBF against 0.95).
    """
    from lifeline.control.ettr import SharedCosts, ettr_table, lifeline_costs, modeled_peers

    row = next((r for r in checkpoint if r["experts_per_layer"] == 32), checkpoint[-1])
    stages = recovery["stages"] if recovery else 3
    fixed = measured_recovery_seconds(recovery, recovery_costs)
    pace, pace_source = _replay_pace(recovery, stages)
    shared = SharedCosts(
        iteration_seconds=row["step_seconds"], gpus=GPUS, gpu_mtbf_seconds=GPU_MTBF_HOURS * 3600.0,
        detection_seconds=fixed["detection_seconds"], restart_seconds=fixed["restart_seconds"],
        rendezvous_seconds=fixed["rendezvous_seconds"], dense_bytes=row["dense_bytes_per_step"],
        host_bytes_per_second=row["copy_bytes_per_second"], network_bytes_per_second=NETWORK_BYTES_PER_SECOND,
        storage_bytes_per_second=STORAGE_BYTES_PER_SECOND, replay_pace=pace)
    peers = modeled_peers(shared, window=row["window"], sparse_bytes=row["sparse_bytes_per_step"])
    # the runtime's default: a dense checkpoint every step whose copy overlaps the next step
    ours = lifeline_costs(shared, stall_seconds=row["dense_overlapped_stall_seconds"])
    # sparse slots as the runtime captures them today: packed before the next step (not overlapped)
    sparse = lifeline_costs(shared, stall_seconds=row["sparse_stall_seconds"], window=row["window"],
                            sparse_bytes=row["sparse_bytes_per_step"],
                            name="Lifeline (sparse slots, copied before the next step)")
    table = ettr_table([*peers, ours, sparse], shared)
    table["assumptions"] = {"network_bytes_per_second": NETWORK_BYTES_PER_SECOND,
                            "storage_bytes_per_second": STORAGE_BYTES_PER_SECOND,
                            "gpu_mtbf_hours": GPU_MTBF_HOURS,
                            "restart_seconds": RESTART_SECONDS if fixed["source"] == "assumed" else None,
                            "fed_from_experts_per_layer": row["experts_per_layer"]}
    table["measured"] = {**fixed, "replay_pace": pace, "replay_pace_source": pace_source,
                         "iteration_seconds": shared.iteration_seconds, "dense_bytes": shared.dense_bytes,
                         "host_bytes_per_second": shared.host_bytes_per_second}
    lifeline10 = table["systems"]["Lifeline"]["ettr"]["10"]
    table["target"] = {"lifeline_at_mtbf_10_minutes": lifeline10, "target": 0.95, "met": lifeline10 >= 0.95}
    return table
