"""Effective training time ratio (ETTR): accounting and models at scale (pure).

ETTR is the fraction of wall-clock time spent on training progress that is kept (Kokolis et
al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", 2024,
§"Effective Training Time Ratio"). Time not kept goes to checkpoint stalls, recovery (failure
detection to resumed training) and rework (steps computed again after a rollback, or
replayed).

- :func:`ettr`, :func:`expected_ettr`: a run's breakdown; periodic checkpointing's first-order model.
- At scale (:mod:`lifeline.control._ettr_model`): :class:`SharedCosts` holds what every system is
  charged the same (the job, bandwidths, the failure rate from a per-GPU MTBF, the measured
  detection, restart and rendezvous times); :class:`SystemCosts` what one system's design
  changes (stall, interval, bytes, restore tier, what is recomputed); :func:`ettr_at_scale`
  charges both with one formula, ``u (1 - lambda L)``; :func:`ettr_table` is the benchmark's report.
- The systems (:mod:`lifeline.control._ettr_systems`): :func:`checkfreq`, :func:`gemini`,
  :func:`moevement` (from their papers' mechanisms; :func:`modeled_peers` builds all three),
  :func:`lifeline_costs` (ours, from its measured stall).
- The model's validation (:mod:`lifeline.control._ettr_paper`): :func:`moevement_paper_setting`,
  the MoEvement paper's setting, whose reported ETTRs (:data:`PAPER_ETTR`) the model reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.control._ettr_model import (
    SharedCosts,
    SystemCosts,
    ettr_at_scale,
    ettr_table,
    failure_terms,
    pipeline_replay_pace,
    rollback_lost_seconds,
    window_rework_seconds,
)
from lifeline.control._ettr_paper import PAPER_ETTR, PAPER_INPUTS, moevement_paper_setting
from lifeline.control._ettr_systems import (
    checkfreq,
    gemini,
    lifeline_costs,
    modeled_peers,
    moevement,
    moevement_window,
)
from lifeline.errors import ConfigError

__all__ = [
    "PAPER_ETTR",
    "PAPER_INPUTS",
    "EttrBreakdown",
    "SharedCosts",
    "SystemCosts",
    "checkfreq",
    "ettr",
    "ettr_at_scale",
    "ettr_table",
    "expected_ettr",
    "failure_terms",
    "gemini",
    "lifeline_costs",
    "modeled_peers",
    "moevement",
    "moevement_paper_setting",
    "moevement_window",
    "pipeline_replay_pace",
    "rollback_lost_seconds",
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
