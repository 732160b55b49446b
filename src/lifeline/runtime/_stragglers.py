"""Per-step compute time for straggler detection, and the ``slow`` fault's sleep (docs/stragglers.md).

In synchronous training every rank's step takes the same wall time: the slowest rank holds every
collective back. What tells a slow rank from the others is its own **compute** time: the step's wall
time minus the time it spent in the step's collectives (a slow rank waits least in them). A trainer
that measures that wait returns it as ``wait_seconds`` on its step result (:class:`ReportsWait`; the
reference ``GPTMoETrainer`` times its gradient all-reduce, clipping's all-gather and pipeline sends and
receives). :class:`StepTimes` adds ``compute_seconds`` and ``wait_seconds`` to the step report and keeps
the last :data:`KEEP` steps' compute seconds (not the process's first step: 1–3× off, measured),
carried as ``timings`` on the step and save reports: a
runner reading only each rank's latest report (the catalog keeps one) still sees every step.

The ``slow`` fault (``lifeline run --inject-failure slow:rank=R:step=S:factor=F``, set by
:mod:`lifeline.launch._slow` in :data:`SLOW_ENV`): from step ``S`` on, before each step the trainer
sleeps so that the step's compute time becomes ``F ×`` its compute time before the fault (the median
of its last :data:`KEEP` steps before ``S``; its first step when it started later): ``F × before −
its previous step's own compute``, counted as compute. The other ranks wait for it in the step's
collectives. Two simpler sleeps failed on the shared 2-core test machine: ``(F − 1) ×`` the step's own
compute, after the step — a sleeping rank frees the cores, its own compute shrank with its sleep
(75 → 30 ms) and the sleep delayed its save and its sidecar's replication into the other ranks'
next step (a healthy rank's compute grew from 27 to 58 ms): slowed 1.0–1.3×, never flagged; and
``(F − 1) ×`` the compute before the fault, before the step: 1.3× (seed 7).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["SLOW_ENV", "KEEP", "ReportsWait", "StepTimes", "parse_slow"]

SLOW_ENV = "LIFELINE_FAULT_SLOW"
"""This rank's ``slow`` fault: ``S:F`` (from step ``S`` on, ``F`` times slower; same name in
:mod:`lifeline.launch.inject`)."""
KEEP = 12
"""Steps of compute time carried on each report (``timings``)."""


@runtime_checkable
class ReportsWait(Protocol):
    """A step result that says how long the step waited in its collectives (seconds)."""

    @property
    def wait_seconds(self) -> float: ...


def parse_slow(raw: str) -> tuple[int, float] | None:
    """``(step, factor)`` of a :data:`SLOW_ENV` value ``S:F``; ``None`` for an empty one.

    Raises:
        ValueError: not ``S:F`` with an integer ``S`` >= 1 and a number ``F`` >= 1.
    """
    if not raw.strip():
        return None
    step, _, factor = raw.strip().partition(":")
    out = int(step), float(factor or 2.0)
    if out[0] < 1 or not out[1] >= 1.0:
        raise ValueError(f"{SLOW_ENV}={raw!r}: want S:F with S >= 1 and F >= 1")
    return out


class StepTimes:
    """This rank's compute seconds per step (see the module docstring).

    Args:
        slow: ``(step, factor)`` of an injected ``slow`` fault, or ``None``.
    """

    def __init__(self, slow: tuple[int, float] | None = None) -> None:
        self.slow = slow
        self.recent: dict[int, float] = {}
        self._before: list[float] = []  # compute seconds of the steps before the slow fault's step
        self._first = True
        self._slept = 0.0
        self._last: float | None = None  # the previous step's own compute seconds (its sleep left out)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StepTimes:
        """The timer of this process (:data:`SLOW_ENV` read from ``env``)."""
        return cls(parse_slow(env.get(SLOW_ENV, "")))

    def before_step(self, step: int) -> None:
        """Call right before training ``step`` (1-based: completed steps after it): an injected ``slow``
        fault sleeps here, from its step on (see the module docstring)."""
        self._slept = 0.0
        if self.slow is None or step < self.slow[0] or self.slow[1] <= 1.0 or not self._before:
            return  # (a process started after the fault's step measures its first step first)
        target = self.slow[1] * statistics.median(self._before)
        self._slept = max(0.0, target - (self._last if self._last is not None else target / self.slow[1]))
        time.sleep(self._slept)

    def after_step(self, result: Any) -> dict[str, Any]:
        """Call right after a trained step (before its report): returns the step report's fields
        ``compute_seconds`` (the injected sleep of :meth:`before_step` included), ``wait_seconds`` (and
        ``slow_seconds``, that sleep); ``{}`` when the result has no ``wait_seconds``."""
        slept, self._slept = self._slept, 0.0
        if not isinstance(result, ReportsWait) or result.seconds is None:
            return {}
        wait = max(0.0, float(result.wait_seconds))
        compute = max(0.0, float(result.seconds) - wait)
        out: dict[str, Any] = {"wait_seconds": round(wait, 6)}
        if self.slow is not None and (result.step < self.slow[0] or not self._before):
            self._before = [*self._before, compute][-KEEP:]  # the reference: its compute before the fault
        self._last = compute
        if slept > 0:
            compute += slept
            out["slow_seconds"] = round(slept, 6)
        out["compute_seconds"] = round(compute, 6)
        first, self._first = self._first, False
        if first:  # a process's first step (lazy initialisation, a cold allocator) is no sample: 1-3x off
            return out
        for step in [s for s in self.recent if s >= result.step]:  # re-run after a rollback: newer are gone
            del self.recent[step]
        self.recent[int(result.step)] = round(compute, 6)
        for step in sorted(self.recent)[:-KEEP]:
            del self.recent[step]
        return out

    def fields(self) -> dict[str, Any]:
        """``{"timings": {"step": compute seconds}}`` of the last :data:`KEEP` steps (``{}`` before any)."""
        return {"timings": {str(s): c for s, c in sorted(self.recent.items())}} if self.recent else {}
