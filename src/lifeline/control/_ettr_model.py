"""ETTR of a large job: the shared inputs, a system's description, and the one formula (pure).

Every system is charged the same :class:`SharedCosts` (the job, the hardware, the failure rate and
the measured detection, restart and rendezvous times); a :class:`SystemCosts` says only what the
system's design changes: its checkpoint stall and interval, the bytes it checkpoints, the tier it
restores from and what it recomputes after a failure. :func:`ettr_at_scale` turns both into an
ETTR with one formula (:func:`failure_terms` lists its terms). The systems' descriptions are
built in :mod:`lifeline.control._ettr_systems`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lifeline.control._checks import integer, non_negative, positive
from lifeline.errors import ConfigError

TIERS = ("host", "peer", "storage")
"""Where a restore reads from: the GPU's own host memory, a peer machine's memory, persistent storage."""
RECOMPUTE = ("rollback", "replay")
"""After a failure every rank rolls back and recomputes (``rollback``), or only the failed
pipeline stage replays from its neighbours' upstream logs while the survivors wait (``replay``)."""


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)  # 3.0000000000000004 iterations is 3


@dataclass(frozen=True)
class SharedCosts:
    """What every system is charged the same: the job, the hardware, failures and restart costs.

    Units: seconds, bytes, bytes/s; bandwidths are per GPU (a node's link shared by its GPUs).

    Attributes:
        iteration_seconds: failure-free time of one training iteration without checkpointing, > 0.
        gpus: GPUs of the job, >= 1.
        gpu_mtbf_seconds: one GPU's mean time between failures (failures of its node, NIC, host
            ... counted against it), > 0. Failures are independent, so the job fails at rate
            ``gpus / gpu_mtbf_seconds`` (:attr:`failure_rate`).
        detection_seconds: failure to the recovery starting (heartbeat / collective timeout,
            supervisor's notice), >= 0. Measured (``lifeline bench recovery``).
        restart_seconds: recovery start to the replacement processes ready to join (planning,
            scheduling, process start), >= 0. Measured.
        rendezvous_seconds: the ranks' rendezvous, barrier and process-group build, >= 0. Measured.
        dense_bytes: one GPU's full training state (weights + optimizer state), bytes, > 0: the
            same job for every system.
        host_bytes_per_second: GPU to its own host memory (the snapshot copy), > 0.
        network_bytes_per_second: GPU's share of the link to a peer machine's memory, as left for
            checkpoint traffic by training's own traffic, > 0.
        storage_bytes_per_second: GPU's share of the bandwidth to persistent storage, > 0.
        replay_pace: wall time one pipeline stage needs to replay one iteration from logged
            inputs and output gradients, over ``iteration_seconds``, in (0, 1]
            (:func:`pipeline_replay_pace`, or measured); the pace of every localized replay.

    Raises:
        ConfigError: a term out of range (names the field).
    """

    iteration_seconds: float
    gpus: int
    gpu_mtbf_seconds: float
    detection_seconds: float
    restart_seconds: float
    rendezvous_seconds: float
    dense_bytes: float
    host_bytes_per_second: float
    network_bytes_per_second: float
    storage_bytes_per_second: float
    replay_pace: float = 1.0

    def __post_init__(self) -> None:
        integer("gpus", self.gpus, 1)
        for name in ("iteration_seconds", "gpu_mtbf_seconds", "dense_bytes", "host_bytes_per_second",
                     "network_bytes_per_second", "storage_bytes_per_second"):
            positive(name, getattr(self, name))
        for name in ("detection_seconds", "restart_seconds", "rendezvous_seconds"):
            non_negative(name, getattr(self, name))
        if positive("replay_pace", self.replay_pace) > 1:
            raise ConfigError(f"replay_pace must be in (0, 1] (a stage replays an iteration in at most the "
                              f"iteration's time), got {self.replay_pace!r}", field="replay_pace")

    @property
    def failure_rate(self) -> float:
        """The job's failures per second: ``gpus / gpu_mtbf_seconds``."""
        return self.gpus / self.gpu_mtbf_seconds

    @property
    def job_mtbf_seconds(self) -> float:
        """The job's mean time between failures, s: ``gpu_mtbf_seconds / gpus``."""
        return self.gpu_mtbf_seconds / self.gpus

    @property
    def fixed_recovery_seconds(self) -> float:
        """Detection + restart + rendezvous, s: what every system pays per failure before restoring."""
        return self.detection_seconds + self.restart_seconds + self.rendezvous_seconds

    def tier_bytes_per_second(self, tier: str) -> float:
        """The bandwidth a restore from ``tier`` reads at, B/s (host, peer or storage)."""
        bandwidth = {"host": self.host_bytes_per_second, "peer": self.network_bytes_per_second,
                     "storage": self.storage_bytes_per_second}
        if tier not in bandwidth:
            raise ConfigError(f"restore_tier must be one of {TIERS}, got {tier!r}", field="restore_tier")
        return bandwidth[tier]

    def with_job_mtbf(self, minutes: float) -> SharedCosts:
        """The same inputs with the per-GPU MTBF that gives this job an MTBF of ``minutes``."""
        return replace(self, gpu_mtbf_seconds=positive("mtbf_minutes_per_job", minutes) * 60.0 * self.gpus)


def pipeline_replay_pace(stages: int, microbatches: int) -> float:
    """Replay pace of one stage of a 1F1B / GPipe pipeline, ``m / (m + p - 1)``.

    An iteration of ``m`` micro-batches through ``p`` stages takes ``m + p - 1`` forward-backward
    slots, of which one stage is busy ``m`` (the pipeline bubble is ``(p - 1) / m`` of the ideal
    time; Narayanan et al., SC '21, §2.2). A stage replaying from logged inputs and output
    gradients waits for no neighbour, so it replays an iteration in ``m`` slots.

    Raises:
        ConfigError: ``stages`` or ``microbatches`` < 1.
    """
    p, m = integer("stages", stages, 1), integer("microbatches", microbatches, 1)
    return m / (m + p - 1)


def rollback_lost_seconds(period_seconds: float, lag_seconds: float = 0.0) -> float:
    """Mean progress lost to a rollback, s: ``P / 2 + lag``.

    Checkpoints are taken every ``P = k T + C`` s (Young 1974: a failure uniform over the period
    loses half of it); a checkpoint is restorable only ``lag`` s after it is taken (the copy to its
    tier), so the latest restorable one is on average ``lag`` older.
    """
    return positive("period_seconds", period_seconds) / 2.0 + non_negative("lag_seconds", lag_seconds)


def window_rework_seconds(window: int, step_seconds: float, lag_seconds: float = 0.0) -> float:
    """Mean progress a sparse checkpoint's recovery replays, s: ``(1.5 W - 1) step + lag``.

    A window's W slots are captured after W consecutive iterations; the state is consistent at the
    last one after replaying the W - 1 iterations since the first (MoEvement §4, sparse-to-dense
    conversion), then the iterations from the window's end to the failure, uniform over the next
    window: W / 2 on average; ``lag`` as in :func:`rollback_lost_seconds`. ``W = 1`` (a dense
    checkpoint every iteration) gives half a period, as a rollback does.

    Raises:
        ConfigError: ``window`` < 1, a non-positive step time or a negative lag.
    """
    w = integer("window", window, 1)
    return (1.5 * w - 1.0) * positive("step_seconds", step_seconds) + non_negative("lag_seconds", lag_seconds)


@dataclass(frozen=True)
class SystemCosts:
    """What a system's design changes, per GPU (units: iterations, seconds, bytes).

    Attributes:
        name: the system ("CheckFreq", "Gemini", "MoEvement", "Lifeline" ...).
        interval_iterations: iterations between checkpoints ``k``, >= 1.
        stall_seconds: training's stall per checkpoint ``C``, s, >= 0.
        checkpoint_bytes: bytes one GPU copies per checkpoint, >= 0 (reported; the stall and the
            lag it causes are already in ``stall_seconds`` and ``lost_seconds``).
        restore_tier: where the state is read back from after a failure: "host", "peer" or
            "storage" (read at :meth:`SharedCosts.tier_bytes_per_second`).
        restore_bytes: bytes one GPU reads back, >= 0.
        recompute: "rollback" (every rank recomputes the lost progress) or "replay" (only the
            failed stage replays it from upstream logs; the survivors wait).
        lost_seconds: mean progress lost per failure, s of failure-free time, >= 0
            (:func:`rollback_lost_seconds`, :func:`window_rework_seconds`).

    Raises:
        ConfigError: an empty name or a term out of range (names the field).
    """

    name: str
    interval_iterations: int
    stall_seconds: float
    checkpoint_bytes: float
    restore_tier: str
    restore_bytes: float
    recompute: str
    lost_seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a system needs a non-empty name, got {self.name!r}", field="name")
        integer("interval_iterations", self.interval_iterations, 1)
        for name in ("stall_seconds", "checkpoint_bytes", "restore_bytes", "lost_seconds"):
            non_negative(name, getattr(self, name))
        if self.restore_tier not in TIERS:
            raise ConfigError(f"restore_tier must be one of {TIERS}, got {self.restore_tier!r}", field="restore_tier")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}", field="recompute")


def failure_terms(system: SystemCosts, shared: SharedCosts) -> dict[str, float]:
    """The terms of :func:`ettr_at_scale`, s (and the useful fraction).

    - ``useful`` ``u = k T / (k T + C)``: the failure-free share of time spent training.
    - ``restore_s`` ``= restore_bytes / bandwidth(restore_tier)``.
    - ``recovery_s`` ``R = detection + restart + rendezvous + restore_s``.
    - ``rework_s`` ``X = lost_seconds x pace``, wall-clock seconds of the whole job: pace 1 for a
      rollback; ``shared.replay_pace`` for a localized replay, during which the survivors wait
      (a replay is charged in the job's wall-clock time, not in rank-seconds).
    - ``lost_per_failure_s`` ``L = R + X``.
    """
    k, t, c = system.interval_iterations, shared.iteration_seconds, system.stall_seconds
    restore = system.restore_bytes / shared.tier_bytes_per_second(system.restore_tier)
    recovery = shared.fixed_recovery_seconds + restore
    pace = 1.0 if system.recompute == "rollback" else shared.replay_pace
    rework = system.lost_seconds * pace
    return {"useful": k * t / (k * t + c), "restore_s": restore, "recovery_s": recovery, "rework_s": rework,
            "lost_per_failure_s": recovery + rework}


def ettr_at_scale(system: SystemCosts, shared: SharedCosts) -> float:
    """First-order expected ETTR of ``system`` under ``shared``, in [0, 1].

    ``ETTR = u (1 - lambda L)``, clamped to [0, 1], with ``u = k T / (k T + C)``,
    ``lambda = gpus / gpu_mtbf_seconds`` and ``L = D + S + Z + restore + X``
    (:func:`failure_terms`): of the wall time, the share ``lambda L`` goes to failures
    (detection ``D``, restart ``S``, rendezvous ``Z``, restore, rework ``X``) and the rest trains
    at the failure-free share ``u`` (Young 1974's first-order model; ETTR as defined by Kokolis et
    al. 2024). With ``X`` = half a period and ``D + S + Z + restore = R`` this is
    :func:`lifeline.control.expected_ettr`.
    """
    terms = failure_terms(system, shared)
    return min(1.0, max(0.0, terms["useful"] * (1.0 - shared.failure_rate * terms["lost_per_failure_s"])))


def ettr_table(systems: Iterable[SystemCosts], shared: SharedCosts,
               mtbf_minutes: Sequence[float] = (10, 20, 60)) -> dict[str, Any]:
    """The benchmark's ETTR report, JSON-ready.

    Each system at the job MTBFs ``mtbf_minutes`` (the per-GPU MTBF each implies at
    ``shared.gpus`` is reported in ``gpu_mtbf_hours``) and at ``shared.gpu_mtbf_seconds``
    (``ettr_at_gpu_mtbf``).

    Returns:
        ``{"gpus", "mtbf_minutes": [..], "gpu_mtbf_hours": {"<minutes>": h}, "at_gpu_mtbf":
        {"gpu_mtbf_hours", "job_mtbf_minutes"}, "shared": {SharedCosts' fields}, "systems": {name:
        {"ettr": {"<minutes>": float}, "ettr_at_gpu_mtbf", "interval_s", "stall_s", "recovery_s",
        "restore_s", "rework_s", "lost_per_failure_s", "useful", "interval_iterations",
        "checkpoint_bytes", "restore_tier", "restore_bytes", "recompute"}}}``; the keys of ``ettr``
        are the MTBFs as ``f"{m:g}"`` ("10", "20", "60").

    Raises:
        ConfigError: no systems, duplicate names, no MTBF or a bad one.
    """
    rows = tuple(systems)
    if not rows or not all(isinstance(s, SystemCosts) for s in rows) or len({s.name for s in rows}) != len(rows):
        raise ConfigError("systems must be SystemCosts values with distinct names, at least one", field="systems")
    if not isinstance(shared, SharedCosts):
        raise ConfigError(f"shared must be a SharedCosts, got {type(shared).__name__}", field="shared")
    if not mtbf_minutes:
        raise ConfigError("mtbf_minutes is empty: give the job MTBFs to report, minutes", field="mtbf_minutes")
    at = {f"{m:g}": shared.with_job_mtbf(m) for m in mtbf_minutes}

    def row(s: SystemCosts) -> dict[str, Any]:
        terms = failure_terms(s, shared)
        return {
            "ettr": {key: ettr_at_scale(s, sh) for key, sh in at.items()},
            "ettr_at_gpu_mtbf": ettr_at_scale(s, shared),
            "interval_s": s.interval_iterations * shared.iteration_seconds, "stall_s": s.stall_seconds,
            "recovery_s": terms["recovery_s"], "restore_s": terms["restore_s"], "rework_s": terms["rework_s"],
            "lost_per_failure_s": terms["lost_per_failure_s"], "useful": terms["useful"],
            "interval_iterations": s.interval_iterations, "checkpoint_bytes": s.checkpoint_bytes,
            "restore_tier": s.restore_tier, "restore_bytes": s.restore_bytes, "recompute": s.recompute,
        }

    return {
        "gpus": shared.gpus,
        "mtbf_minutes": [float(m) for m in mtbf_minutes],
        "gpu_mtbf_hours": {key: sh.gpu_mtbf_seconds / 3600.0 for key, sh in at.items()},
        "at_gpu_mtbf": {"gpu_mtbf_hours": shared.gpu_mtbf_seconds / 3600.0,
                        "job_mtbf_minutes": shared.job_mtbf_seconds / 60.0},
        "shared": {name: getattr(shared, name) for name in SharedCosts.__dataclass_fields__},
        "systems": {s.name: row(s) for s in rows},
    }
