"""``bench moe``'s ETTR rows: a 16,384-GPU job at MTBF 10, 20 and 60 minutes.

Lifeline's row is fed with this run's measurements: step time, the stall of a dense checkpoint
every step whose copy overlaps the next step (the runtime's default save), the localized
recovery's time to the failure step and its measured recompute ratio; a second row uses the
sparse slots' copy stall instead (they are copied before the next step); CheckFreq, Gemini
and MoEvement are modeled from their papers' formulas (:func:`lifeline.control.ettr.modeled_peers`)
with the same step time, state sizes and copy bandwidth, and the stated link and storage bandwidths.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ettr_rows", "NETWORK_BYTES_PER_SECOND", "STORAGE_BYTES_PER_SECOND", "RESTART_SECONDS"]

NETWORK_BYTES_PER_SECOND = 12.5e9
"""Assumed per-rank link to a peer (100 Gb/s), for Gemini's and MoEvement's replication."""
STORAGE_BYTES_PER_SECOND = 1.0e9
"""Assumed per-rank write bandwidth to remote storage, for CheckFreq's persist phase."""
RESTART_SECONDS = 60.0
"""Assumed restart of a whole job from a checkpoint at 16,384 GPUs (scheduling, process start, load)."""


def ettr_rows(checkpoint: list[dict[str, Any]], recovery: dict[str, Any] | None) -> dict[str, Any]:
    """The ETTR table (see the module docstring) from the 32-expert checkpoint row (else the largest)."""
    from lifeline.control.ettr import ettr_table, lifeline_costs, modeled_peers

    row = next((r for r in checkpoint if r["experts_per_layer"] == 32), checkpoint[-1])
    stages = recovery["stages"] if recovery else 3
    step = row["step_seconds"]
    local = (recovery or {}).get("localized", {})
    recovery_seconds = float(local.get("to_failure_step_seconds") or RESTART_SECONDS)
    fraction = (recovery or {}).get("recomputed_ratio_at_median_step") or 1.0 / stages
    peers = modeled_peers(step_seconds=step, stages=stages, window=row["window"],
                          dense_bytes=row["dense_bytes_per_step"], sparse_bytes=row["sparse_bytes_per_step"],
                          snapshot_bytes_per_second=row["copy_bytes_per_second"],
                          network_bytes_per_second=NETWORK_BYTES_PER_SECOND,
                          storage_bytes_per_second=STORAGE_BYTES_PER_SECOND, restart_seconds=RESTART_SECONDS)
    fraction = min(1.0, max(fraction, 1e-6))
    # the runtime's default: a dense checkpoint every step whose copy overlaps the next step
    ours = lifeline_costs(step_seconds=step, stall_seconds=row["dense_overlapped_stall_seconds"],
                          recovery_seconds=recovery_seconds, window=1, stages=stages, recompute_fraction=fraction)
    # sparse slots as the runtime captures them today: packed before the next step (not overlapped)
    sparse = lifeline_costs(step_seconds=step, stall_seconds=row["sparse_stall_seconds"],
                            recovery_seconds=recovery_seconds, window=row["window"], stages=stages,
                            recompute_fraction=fraction, name="Lifeline (sparse slots, copied before the next step)")
    table = ettr_table([*peers, ours, sparse])
    table["assumptions"] = {"network_bytes_per_second": NETWORK_BYTES_PER_SECOND,
                            "storage_bytes_per_second": STORAGE_BYTES_PER_SECOND,
                            "restart_seconds": RESTART_SECONDS, "fed_from_experts_per_layer": row["experts_per_layer"]}
    lifeline10 = table["systems"]["Lifeline"]["ettr"]["10"]
    table["target"] = {"lifeline_at_mtbf_10_minutes": lifeline10, "target": 0.95, "met": lifeline10 >= 0.95}
    return table
