"""Effective training time ratio (ETTR): accounting and models at scale (pure).

ETTR is the fraction of wall-clock time spent on training progress that is kept (Kokolis et
al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", 2024,
§"Effective Training Time Ratio"). Time not kept goes to checkpoint stalls, recovery (failure
detection to resumed training) and rework (steps computed again after a rollback, or
replayed).

- :func:`ettr`, :func:`expected_ettr`: a run's breakdown; periodic checkpointing's first-order model.
- :class:`SystemCosts`, :func:`ettr_at_scale`: the same first-order model for any system's
  costs; :func:`modeled_peers` (CheckFreq, Gemini, MoEvement from their papers' mechanisms),
  :func:`lifeline_costs` (ours, from measurements), :func:`ettr_table` (the benchmark's report).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lifeline.control._checks import integer, non_negative, positive
from lifeline.errors import ConfigError

__all__ = [
    "EttrBreakdown",
    "SystemCosts",
    "ettr",
    "ettr_at_scale",
    "ettr_table",
    "expected_ettr",
    "lifeline_costs",
    "modeled_peers",
    "window_rework_seconds",
]


@dataclass(frozen=True)
class EttrBreakdown:
    """Where the wall-clock time of a run went, seconds.

    ``productive + checkpoint_stall + recovery + rework == wall`` (``rework`` absorbs what
    the other terms do not explain: recomputed steps and any idle time).
    """

    wall: float
    productive: float
    checkpoint_stall: float
    recovery: float
    rework: float

    @property
    def ratio(self) -> float:
        """ETTR = productive / wall, in [0, 1]."""
        return self.productive / self.wall


def ettr(
    *,
    wall_seconds: float,
    steps: int,
    step_seconds: float,
    checkpoint_stall_seconds: float = 0.0,
    recovery_seconds: float = 0.0,
) -> EttrBreakdown:
    """Account a finished (or running) job's time.

    Args:
        wall_seconds: elapsed time from start to now, > 0.
        steps: optimizer steps kept (``status.step``): each counts once however often it ran.
        step_seconds: mean time of one step without failures or checkpoints, > 0.
        checkpoint_stall_seconds: total trainer stall on saves (memcpy + backpressure).
        recovery_seconds: total detection-to-resume time (sum of ``status.recoveries[].seconds``).

    Raises:
        ConfigError: non-positive wall or step time, negative terms, or terms that add up to
            more than ``wall_seconds`` (the inputs disagree).
    """
    if wall_seconds <= 0 or step_seconds <= 0:
        raise ConfigError("wall_seconds and step_seconds must be > 0", field="wall_seconds")
    if steps < 0 or checkpoint_stall_seconds < 0 or recovery_seconds < 0:
        raise ConfigError("steps, stall and recovery time must be >= 0", field="steps")
    productive = steps * step_seconds
    rework = wall_seconds - productive - checkpoint_stall_seconds - recovery_seconds
    if rework < -1e-9 * wall_seconds:
        raise ConfigError(
            f"productive ({productive:.3f}s) + stall ({checkpoint_stall_seconds:.3f}s) + recovery "
            f"({recovery_seconds:.3f}s) exceed the wall time ({wall_seconds:.3f}s); check step_seconds",
            field="step_seconds",
        )
    return EttrBreakdown(wall_seconds, productive, checkpoint_stall_seconds, recovery_seconds, max(rework, 0.0))


def expected_ettr(
    *, interval_seconds: float, save_seconds: float, restore_seconds: float, mtbf_seconds: float
) -> float:
    """First-order expected ETTR of periodic checkpointing (the model behind Young 1974).

    Every ``interval_seconds`` of compute costs ``save_seconds`` of stall; each failure (one
    per ``mtbf_seconds``) costs ``restore_seconds`` plus on average half an interval of rework:
    ``ETTR = T / (T + C) * max(0, 1 - (R + (T + C) / 2) / M)``.

    Raises:
        ConfigError: non-positive interval or MTBF, or negative costs.
    """
    if interval_seconds <= 0 or mtbf_seconds <= 0 or save_seconds < 0 or restore_seconds < 0:
        raise ConfigError("interval and MTBF must be > 0, save and restore times >= 0", field="interval_seconds")
    period = interval_seconds + save_seconds
    return interval_seconds / period * max(0.0, 1.0 - (restore_seconds + period / 2.0) / mtbf_seconds)


# --- ETTR of a large job, modeled from each system's costs -------------------------------------


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 3.0000000000000004 steps is 3 steps


@dataclass(frozen=True)
class SystemCosts:
    """What checkpointing and one failure cost a system, per rank, seconds.

    Attributes:
        name: the system ("CheckFreq", "Gemini", "MoEvement", "Lifeline" ...).
        interval_seconds: compute time between checkpoints, > 0 (one step when every step is
            checkpointed).
        stall_seconds: the trainer's stall per checkpoint, >= 0.
        recovery_seconds: failure to state restored and training resumable (detection,
            restart, loading the checkpoint), >= 0; recomputation is not in it.
        recompute_fraction: the share of each lost step's work that must run again, in
            (0, 1]: 1.0 when every rank rolls back; 1/stages when only the failed stage replays
            with its neighbours' logged inputs and output gradients (no pipeline waits, so a
            step replays in about 1/stages of its time: MoEvement's upstream logging).
        rework_seconds: mean lost progress per failure, in full-job step time: half a
            checkpoint period for periodic checkpoints, a window replay for sparse ones
            (:func:`window_rework_seconds`).

    Raises:
        ConfigError: an empty name or a term out of range (names the field).
    """

    name: str
    interval_seconds: float
    stall_seconds: float
    recovery_seconds: float
    recompute_fraction: float
    rework_seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a system needs a non-empty name, got {self.name!r}", field="name")
        positive("interval_seconds", self.interval_seconds)
        for field in ("stall_seconds", "recovery_seconds", "rework_seconds"):
            non_negative(field, getattr(self, field))
        if non_negative("recompute_fraction", self.recompute_fraction) == 0 or self.recompute_fraction > 1:
            raise ConfigError(f"recompute_fraction must be in (0, 1] (1.0 global rollback, 1/stages localized), "
                              f"got {self.recompute_fraction!r}", field="recompute_fraction")


def ettr_at_scale(
    costs: SystemCosts, *, gpus: int, mtbf_minutes_per_job: float | None = None, gpu_mtbf_hours: float | None = None
) -> float:
    """First-order expected ETTR of a job of ``gpus`` GPUs, in [0, 1].

    ``ETTR = T / (T + C) * (1 - (R + f * X) / M)``, clamped to [0, 1]: of every period of
    ``T`` compute and ``C`` stall (``interval_seconds``, ``stall_seconds``) only ``T`` is
    training; each failure, one per job MTBF ``M``, costs the recovery ``R``
    (``recovery_seconds``) plus the rework ``X`` (``rework_seconds``) done by the share ``f``
    (``recompute_fraction``) of the job that recomputes. For periodic checkpoints with
    ``X = (T + C) / 2`` this is :func:`expected_ettr`.

    Args:
        costs: the system's costs.
        gpus: GPUs in the job, >= 1.
        mtbf_minutes_per_job: the job's mean time between failures, minutes; or
        gpu_mtbf_hours: one GPU's MTBF, hours (independent failures: job MTBF = it / gpus).
            Exactly one of the two.

    Raises:
        ConfigError: both or neither MTBF, a non-positive MTBF or GPU count.
    """
    integer("gpus", gpus, 1)
    if (mtbf_minutes_per_job is None) == (gpu_mtbf_hours is None):
        raise ConfigError("give exactly one of mtbf_minutes_per_job and gpu_mtbf_hours", field="mtbf_minutes_per_job")
    if mtbf_minutes_per_job is not None:
        mtbf = positive("mtbf_minutes_per_job", mtbf_minutes_per_job) * 60.0
    else:
        mtbf = positive("gpu_mtbf_hours", gpu_mtbf_hours) * 3600.0 / gpus  # type: ignore[arg-type]
    c = costs
    useful = c.interval_seconds / (c.interval_seconds + c.stall_seconds)
    lost = c.recovery_seconds + c.recompute_fraction * c.rework_seconds
    return min(1.0, max(0.0, useful * (1.0 - lost / mtbf)))


def window_rework_seconds(window: int, step_seconds: float) -> float:
    """Mean replay after a failure under sparse checkpoints, seconds of full-job step time: ``1.5 W step``.

    The latest complete window is replayed whole (W steps) to rebuild a consistent state, then
    the steps from its end to the failure: uniform over the window in progress, W/2 on average.

    Raises:
        ConfigError: ``window`` < 1 or a non-positive step time.
    """
    return 1.5 * integer("window", window, 1) * positive("step_seconds", step_seconds)


def modeled_peers(
    *,
    step_seconds: float,
    stages: int,
    window: int,
    dense_bytes: int,
    sparse_bytes: int,
    snapshot_bytes_per_second: float,
    network_bytes_per_second: float,
    storage_bytes_per_second: float,
    restart_seconds: float,
    checkfreq_overhead: float = 0.035,
    gemini_peer_copies: int = 1,
) -> tuple[SystemCosts, SystemCosts, SystemCosts]:
    """CheckFreq, Gemini and MoEvement as published, modeled from one rank's sizes and bandwidths.

    - **CheckFreq** (Mohan et al., FAST '21, §4): two-phase checkpoints; the GPU-to-CPU snapshot
      overlaps the next step's forward and backward pass, so the stall is
      ``max(0, dense / snapshot_bw - step)``; the persist to storage runs in the background and
      the next checkpoint waits for it; the frequency is the highest keeping the stall within
      ``checkfreq_overhead`` of training time (3.5 %, the bound it reports):
      ``k = max(1, ceil(stall / (p step)), ceil((snapshot + persist) / step))`` steps. Recovery
      reads the checkpoint back from storage; every rank rolls back half a period on average.
    - **Gemini** (Wang et al., SOSP '23, §3-5): checkpoints to the CPU memory of the local and
      ``gemini_peer_copies`` peer machines, the network traffic interleaved with training's;
      the consistent GPU-to-CPU snapshot stalls like CheckFreq's; it checkpoints every step
      when one checkpoint's transfer fits in one, else every
      ``k = ceil(max(dense / snapshot_bw, copies dense / network_bw) / step)`` steps. Recovery
      fetches the state from a peer's memory; every rank rolls back half a period.
    - **MoEvement** (Gandhi and Kozyrakis, NSDI '26, arXiv 2412.15411: §4's
      schedule, upstream logging): a sparse checkpoint of
      ``sparse_bytes`` every step, the copy overlapped with the step (stall
      ``max(0, sparse / snapshot_bw - step)``); recovery fetches the failed stage's latest
      window (at most ``window x sparse_bytes``) from a peer; only that stage replays
      (fraction ``1 / stages``) :func:`window_rework_seconds`.

    Args:
        step_seconds: failure-free step time, s.
        stages: pipeline stages, >= 1.
        window: MoEvement's window W, steps (:attr:`WindowSchedule.window`).
        dense_bytes: one rank's full training state (12 B/param: fp32 weights + Adam moments).
        sparse_bytes: bytes one rank copies per step under the sparse schedule
            (:attr:`WindowSchedule.max_slot_bytes`).
        snapshot_bytes_per_second: GPU-to-host copy bandwidth per rank, B/s.
        network_bytes_per_second: inter-node bandwidth per rank left for checkpoint traffic, B/s.
        storage_bytes_per_second: persistent-storage bandwidth per rank, B/s.
        restart_seconds: failure detection + process restart + rendezvous, s (same for all).
        checkfreq_overhead: CheckFreq's stall budget ``p``, in (0, 1).
        gemini_peer_copies: Gemini's remote copies, >= 1.

    Returns:
        ``(checkfreq, gemini, moevement)``.

    Raises:
        ConfigError: a non-positive size, bandwidth, step time or count (names the field).
    """
    step = positive("step_seconds", step_seconds)
    stages, window = integer("stages", stages, 1), integer("window", window, 1)
    dense, sparse = positive("dense_bytes", dense_bytes), positive("sparse_bytes", sparse_bytes)
    snap_bw = positive("snapshot_bytes_per_second", snapshot_bytes_per_second)
    net_bw = positive("network_bytes_per_second", network_bytes_per_second)
    store_bw = positive("storage_bytes_per_second", storage_bytes_per_second)
    restart = non_negative("restart_seconds", restart_seconds)
    copies = integer("gemini_peer_copies", gemini_peer_copies, 1)
    if not 0 < positive("checkfreq_overhead", checkfreq_overhead) < 1:
        raise ConfigError(f"checkfreq_overhead must be in (0, 1), got {checkfreq_overhead!r}", field="checkfreq_overhead")

    snapshot, persist = dense / snap_bw, dense / store_bw
    stall = max(0.0, snapshot - step)
    k = max(1, _ceil(stall / (checkfreq_overhead * step)), _ceil((snapshot + persist) / step))
    checkfreq = SystemCosts("CheckFreq", k * step, stall, restart + persist, 1.0, (k * step + stall) / 2)
    k = max(1, _ceil(max(snapshot, copies * dense / net_bw) / step))
    gemini = SystemCosts("Gemini", k * step, stall, restart + dense / net_bw, 1.0, (k * step + stall) / 2)
    moevement = SystemCosts("MoEvement", step, max(0.0, sparse / snap_bw - step), restart + window * sparse / net_bw,
                            1.0 / stages, window_rework_seconds(window, step))
    return checkfreq, gemini, moevement


def lifeline_costs(
    *,
    step_seconds: float,
    stall_seconds: float,
    recovery_seconds: float,
    window: int,
    stages: int,
    recompute_fraction: float | None = None,
    name: str = "Lifeline",
) -> SystemCosts:
    """Lifeline's costs from measurements: a sparse checkpoint every step, localized replay.

    Args:
        step_seconds: measured failure-free step time, s.
        stall_seconds: measured trainer stall per step of the sparse checkpoint (memcpy into
            the arena + backpressure wait), s.
        recovery_seconds: measured failure to the failed stage's window loaded (detection,
            restart, restore), s; the replay is the rework term, not part of it.
        window: the window W in force, steps.
        stages: pipeline stages, >= 1.
        recompute_fraction: the measured rank-seconds of a localized recovery over a global
            rollback's, in (0, 1]; default ``1 / stages``.
        name: the row's name.

    Raises:
        ConfigError: a term out of range (names the field).
    """
    step = positive("step_seconds", step_seconds)
    stages = integer("stages", stages, 1)
    fraction = 1.0 / stages if recompute_fraction is None else recompute_fraction
    return SystemCosts(name, step, non_negative("stall_seconds", stall_seconds),
                       non_negative("recovery_seconds", recovery_seconds), fraction, window_rework_seconds(window, step))


def ettr_table(
    systems: Iterable[SystemCosts], mtbf_minutes: Sequence[float] = (10, 20, 60), gpus: int = 16384
) -> dict:
    """The benchmark's ETTR report, JSON-ready.

    Returns:
        ``{"gpus": int, "mtbf_minutes": [..], "systems": {name: {"ettr": {"<minutes>": float},
        "interval_s", "stall_s", "recovery_s", "recompute_fraction", "rework_s"}}}``; the
        ``ettr`` keys are the MTBFs as ``f"{m:g}"`` ("10", "20", "60").

    Raises:
        ConfigError: no systems, duplicate names, no MTBF or a bad one, a bad GPU count.
    """
    rows = tuple(systems)
    if not all(isinstance(s, SystemCosts) for s in rows) or not rows or len({s.name for s in rows}) != len(rows):
        raise ConfigError("systems must be SystemCosts values with distinct names, at least one", field="systems")
    if not mtbf_minutes:
        raise ConfigError("mtbf_minutes is empty: give the job MTBFs to report, minutes", field="mtbf_minutes")
    return {
        "gpus": gpus,
        "mtbf_minutes": [float(m) for m in mtbf_minutes],
        "systems": {
            s.name: {
                "ettr": {f"{m:g}": ettr_at_scale(s, gpus=gpus, mtbf_minutes_per_job=m) for m in mtbf_minutes},
                "interval_s": s.interval_seconds,
                "stall_s": s.stall_seconds,
                "recovery_s": s.recovery_seconds,
                "recompute_fraction": s.recompute_fraction,
                "rework_s": s.rework_seconds,
            }
            for s in rows
        },
    }
