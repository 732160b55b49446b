"""The end of a local run: the summary (steps, wall time, time lost to failures, ETTR) and the
digest of the final parameters, so two runs can be compared bit for bit."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from typing import Any

import torch

from lifeline._poll import wait_for
from lifeline.checkpoint import Storage, list_steps
from lifeline.control import EttrBreakdown, ettr
from lifeline.errors import CatalogError, StorageError

__all__ = ["state_digest", "checksum_digest", "await_l2_step", "await_metas", "summarize"]


def state_digest(tensors: dict[str, Any]) -> str:
    """SHA-256 over a consolidated state in fully-qualified-name order: for every tensor its name,
    dtype, shape and raw bytes (C order). Bit-identical states, and only those, give equal digests."""
    h = hashlib.sha256()
    for fqn in sorted(tensors):
        t = tensors[fqn].detach().contiguous().cpu()
        h.update(f"{fqn}|{t.dtype}|{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def checksum_digest(metas: list[str | None]) -> str:
    """SHA-256 over the crc32c checksums of every chunk and byte entry of one checkpoint's shards
    (the catalog's shard metadata, job name left out). Used when the final step is not in L2: equal
    for bit-identical checkpoints of the same layout; a difference shows with probability 1 - 2^-32
    per differing chunk."""
    h = hashlib.sha256()
    for raw in metas:
        if raw is None:
            h.update(b"missing\n")
            continue
        meta = json.loads(raw)
        tensors = {fqn: [[c[0], c[1], c[4]] for c in t["chunks"]] for fqn, t in meta["tensors"].items()}
        entries = {k: v[2] for k, v in meta.get("bytes", {}).items()}
        h.update(json.dumps({"rank": meta["rank"], "tensors": tensors, "bytes": entries},
                            sort_keys=True).encode())
    return h.hexdigest()


def await_l2_step(storage: Storage, prefix: str, job: str, step: int, timeout: float) -> bool:
    """Poll until checkpoint ``step`` of ``job`` is committed in L2 (its manifest exists), at most
    ``timeout`` seconds, riding out storage errors (a store restarting). Returns whether it is."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if step in list_steps(storage, prefix, job):
                return True
        except StorageError:  # the store is down for a while (a MinIO restart): keep asking
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def await_metas(catalog: Any, step: int, timeout: float) -> list[str | None]:
    """Every rank's shard metadata of ``step`` from ``catalog`` (``Catalog.metas``), polled until none
    is missing, at most ``timeout`` seconds, riding out a Redis restart; what is there then (``None``
    for a rank that never filed).

    A trainer's save returns once its bytes are in the sidecar's arena; the sidecar seals the blob
    (checksums) and files it in the catalog a moment later. A run whose trainers all finished can
    thus be read before the last rank's final checkpoint is filed: digested then, it would name that
    rank ``missing`` and differ from an identical run's digest (2 of the 48 ``lifeline run`` runs of
    24 runs of tests/launch/test_sparse_l2.py's node-loss test did under load, one of them failure-free).

    Raises:
        CatalogError: Redis was still unreachable when the wait ended.
    """
    def filed() -> list[str | None] | None:
        try:
            metas = catalog.metas(step)
        except CatalogError:  # Redis restarting: keep asking
            return None
        return metas if metas and all(m is not None for m in metas) else None

    try:
        return wait_for(filed, timeout, f"every rank's checksums of step {step}", interval=0.05)
    except TimeoutError:
        return catalog.metas(step)  # what is filed by now (a CatalogError if Redis stayed away)


def _time_lost(recoveries: list[Any]) -> float:
    """Seconds from each fault to training past the step reached, once per chain of recoveries (a
    recovery that starts before the previous one caught up — a failure during a recovery, a restore
    that failed — continues its chain: the chain loses from its first fault to its last catch-up)."""
    total, first, end = 0.0, None, None
    for r in recoveries:
        if first is None or end is not None:  # a new chain: the previous one caught up (or none)
            if first is not None and end is not None:
                total += end - first
            first = r.fault_at
        end = r.caught_up_at
    if first is not None and end is not None:
        total += end - first
    return max(0.0, total)


def ettr_terms(wall_seconds: float, kept: int, step_seconds: float | None, stall_seconds: float,
               recovery_seconds: float) -> EttrBreakdown | None:
    """The run's ETTR breakdown (:func:`lifeline.control.ettr`), its terms clamped to the wall time:
    ``recovery_seconds`` sums recoveries that may overlap (a failure during a recovery), so it may
    exceed the wall time (fuzz seed 3314: the summary raised and the run ended without one). As
    measured when they fit (the step time shortened to what the wall time leaves, as before); when
    the recoveries alone leave no room, the kept steps at their measured time and the recoveries the rest. ``None`` without a
    kept step, a step time or a positive wall time (seconds; ``kept``: steps)."""
    if not step_seconds or wall_seconds <= 0 or kept <= 0:
        return None
    recovery, stall = max(0.0, recovery_seconds), max(0.0, stall_seconds)
    if recovery + stall < wall_seconds:  # as measured; the step time is what the wall time leaves at most
        step_s = min(step_seconds, (wall_seconds - recovery - stall) / kept)
    else:  # overlapping recoveries leave no room: the kept steps at their measured time, recovery the rest
        step_s = min(step_seconds, wall_seconds / kept)
        stall = min(stall, wall_seconds - kept * step_s)
        recovery = wall_seconds - kept * step_s - stall
    return ettr(wall_seconds=wall_seconds, steps=kept, step_seconds=step_s, checkpoint_stall_seconds=stall,
                recovery_seconds=recovery)


def summarize(sup: Any, *, phase: str, wall_seconds: float, digest: dict[str, Any] | None) -> dict[str, Any]:
    """The run's summary as a JSON-ready dict.

    Fields: ``job``, ``phase``, ``steps`` (target), ``step`` (reached), ``layout``,
    ``generation``, ``restarts``, ``wall_seconds`` (the caller's: building dependencies left out),
    ``step_seconds`` (median step time of the trainers), ``recovery_seconds`` (sum over recoveries:
    the fault → every rank trained again, detection included), ``time_lost_seconds`` (sum over chains
    of recoveries: the fault → training past the step reached, detection and rework included),
    ``lost_seconds`` (wall time not spent on kept steps: recovery, redone steps, start-up),
    ``ettr`` (:func:`lifeline.control.ettr`: kept step time over wall time),
    ``checkpoint_stall_seconds``, ``recoveries`` (one record each), ``faults`` (each injection that
    fired, :class:`lifeline.launch.faults.FiredFault`), ``stragglers`` (each rank flagged slow, per
    generation: :meth:`lifeline.launch._stragglers.StragglerWatch.summary`), ``health`` (the nodes' health
    check: ``seconds``, ``failed`` ``{node: reason}``, ``compute_ms`` by node, ``rejoins`` ``{node: "passed" | reason}``; ``None`` when not run),
    ``service_restarts`` (servers brought back),
    ``complete_step`` (the latest complete step as sampled every round: samples, rounds without one,
    regressions — it must never move backwards), ``resumed_from`` (the L2 step a restarted run began
    at), ``final_loss``, ``digest`` (``{"sha256", "source", "step"}``), ``state_dir``.
    """
    snap = sup.snapshot
    steps_run = [v for v in sup.step_seconds.values() if v > 0]
    step_seconds = statistics.median(steps_run) if steps_run else None
    stall = sum(sup.stall_seconds.values()) / max(1, sup.layout.world_size)
    recovery = sum(r.seconds or 0.0 for r in snap.recoveries)
    time_lost = _time_lost(snap.recoveries)
    kept = snap.step - (sup.resumed_from or 0)
    breakdown = ettr_terms(wall_seconds, kept, step_seconds, stall, recovery)
    ratio = None if breakdown is None else breakdown.ratio
    return {
        "job": sup.name,
        "phase": phase,
        "steps": sup.job.spec.steps,
        "step": snap.step,
        "layout": sup.layout.to_wire(),
        "generation": snap.generation,
        "restarts": sup.restarts,
        "wall_seconds": round(wall_seconds, 3),
        "step_seconds": None if step_seconds is None else round(step_seconds, 6),
        "recovery_seconds": round(recovery, 3),
        "time_lost_seconds": round(time_lost, 3),
        "lost_seconds": None if breakdown is None else round(breakdown.wall - breakdown.productive, 3),
        "checkpoint_stall_seconds": round(stall, 4),
        "ettr": None if ratio is None else round(ratio, 4),
        "recoveries": [r.to_dict() for r in snap.recoveries],
        "faults": [f.to_dict() for f in getattr(sup.faults, "fired", ())],
        "stragglers": sup.straggling.summary() if getattr(sup, "straggling", None) is not None else [],
        "health": sup.health.summary if getattr(sup, "health", None) is not None else None,
        "service_restarts": dict(getattr(sup.watch, "restarts", {})),
        "complete_step": sup.tally.complete_summary(),
        "resumed_from": sup.resumed_from,
        "final_loss": snap.loss,
        "digest": digest,
        "state_dir": str(sup.state_dir),
    }
