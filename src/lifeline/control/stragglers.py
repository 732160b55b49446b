"""Straggler detection: which ranks compute slower than the others (pure; docs/stragglers.md).

Input: each rank's **compute seconds** per step (the step's wall time minus the time the rank waited in
the step's collectives: :mod:`lifeline.runtime._stragglers`); in synchronous training the wall times are
all equal, the compute times are not. The scores follow NVIDIA Resiliency Extension's straggler
detection (``nvidia_resiliency_ext.straggler``, "Usage guide": a *relative* performance score against
the other ranks and an *individual* one against the rank's own best), written here as slowdowns
(NVRx's scores are their inverses, in (0, 1]):

* **relative** — per step, the rank's compute time ÷ the median of the *other* ranks' compute times of
  that step (the other ranks of its pipeline stage when a grouping is given and it has some: stages
  differ in work); the score is the median of that ratio over the last ``window`` steps every rank reported.
  NVRx compares with the best rank; the median of the others is robust to one fast outlier, and leaving
  the rank itself out keeps a 2× rank at 2 in a world of two (the median of two is their mean: 1.33).
* **individual** — the rank's median compute time over those steps ÷ the lowest median of any
  ``window`` consecutive steps of its history given (its best; 1.0 when it is at its best).

The rule: a rank whose relative score exceeds ``threshold`` is a straggler. The window's median (not
every step) makes one noisy step neither flag a rank nor clear a slow one. The individual score is
reported only: a whole job that slows down (a shared file system, a loaded host) raises every rank's.

:class:`StragglerWatch` keeps the samples of one job across rounds (each runner's: ``lifeline run``'s
:mod:`lifeline.launch._stragglers`, the operator's :mod:`lifeline.operator.stragglers`): fed one catalog
read per round, per generation, and flagging a rank once per generation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from lifeline.api import StragglerSpec
from lifeline.api.trainingjob import LayoutSpec
from lifeline.control.state import stage_of
from lifeline.errors import ConfigError

__all__ = ["HISTORY_WINDOWS", "StragglerScore", "StragglerVerdict", "StragglerWatch", "detect_stragglers",
           "samples_of"]

HISTORY_WINDOWS = 4
"""Steps of samples :class:`StragglerWatch` keeps per rank: this many windows (the individual score's history)."""


@dataclass(frozen=True)
class StragglerScore:
    """One rank's scores (slowdowns: 1.0 is as fast as the others / as its best).

    Attributes:
        rank: the global rank.
        relative: median over the window of (its compute ÷ the other ranks' median compute).
        individual: its window median ÷ its best window median in the history given.
        compute_seconds: its median compute seconds over the window.
        straggler: ``relative > threshold``.
    """

    rank: int
    relative: float
    individual: float
    compute_seconds: float
    straggler: bool

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "relative": round(self.relative, 3), "individual": round(self.individual, 3),
                "compute_seconds": round(self.compute_seconds, 6), "straggler": self.straggler}


@dataclass(frozen=True)
class StragglerVerdict:
    """The outcome of :func:`detect_stragglers`: the ``steps`` judged (ascending; empty when fewer than
    ``window`` steps were reported by every rank: no verdict) and every rank's score."""

    steps: tuple[int, ...]
    scores: tuple[StragglerScore, ...]

    @property
    def stragglers(self) -> tuple[int, ...]:
        """The ranks flagged, ascending."""
        return tuple(s.rank for s in self.scores if s.straggler)


def detect_stragglers(samples: Mapping[int, Mapping[int, float]], *, threshold: float, window: int,
                      group_of: Mapping[int, int] | None = None) -> StragglerVerdict:
    """Score every rank and flag the stragglers (see the module docstring).

    Args:
        samples: rank → {step: compute seconds of that step}; ranks of one layout and one generation
            (a replaced rank's samples start afresh). At least two ranks for any verdict.
        threshold: a rank whose relative score exceeds it is a straggler (> 1, e.g. 1.5).
        window: the number of most recent steps judged, those every rank reported (>= 1).
        group_of: rank → its group (the pipeline stage, :func:`lifeline.control.state.stage_of`): a rank
            is compared with the other ranks of its group, or with every other rank when it has none there.

    Returns:
        The verdict; no steps and no scores with fewer than two ranks or fewer than ``window`` common steps.

    Raises:
        ConfigError: ``threshold`` <= 1 or ``window`` < 1.
    """
    if not threshold > 1.0:
        raise ConfigError(f"straggler threshold must be > 1, got {threshold!r}", field="threshold")
    if window < 1:
        raise ConfigError(f"straggler window must be >= 1 step, got {window!r}", field="window")
    ranks = sorted(samples)
    if len(ranks) < 2:
        return StragglerVerdict((), ())
    common = set.intersection(*(set(samples[r]) for r in ranks))
    steps = tuple(sorted(common)[-window:])
    if len(steps) < window:
        return StragglerVerdict((), ())
    groups: dict[object, list[int]] = {}
    for rank in ranks:
        groups.setdefault(None if group_of is None else group_of.get(rank), []).append(rank)
    peer_group = {r: g if len(groups[g]) > 1 else "all" for g, members in groups.items() for r in members}
    groups["all"] = ranks
    ratios: dict[int, list[float]] = {r: [] for r in ranks}
    for step in steps:  # per step, each group's values sorted once: O(n log n), not O(n^2)
        ordered = {g: sorted((samples[r][step], r) for r in members) for g, members in groups.items()
                   if g == "all" or len(members) > 1}
        for g, values in ordered.items():
            for i, (value, rank) in enumerate(values):
                if peer_group[rank] == g:
                    ratios[rank].append(value / max(_median_without(values, i), 1e-9))
    scores = []
    for rank in ranks:
        relative = statistics.median(ratios[rank])
        mine = statistics.median(samples[rank][s] for s in steps)
        scores.append(StragglerScore(rank, relative, mine / max(_best(samples[rank], window), 1e-9), mine,
                                     relative > threshold))
    return StragglerVerdict(steps, tuple(scores))


def samples_of(reports: Iterable[Any], generation: int, world_size: int) -> dict[int, dict[int, float]]:
    """rank → {step: compute seconds} from the ``timings`` of each rank's reports of ``generation``
    (``report.rank``, ``report.generation``, ``report.get("timings")``: a
    :class:`~lifeline.catalog.ProgressReport`); entries that are not numbers are left out."""
    out: dict[int, dict[int, float]] = {}
    for report in reports:
        timings = report.get("timings")
        if report.generation != generation or not 0 <= report.rank < world_size or not isinstance(timings, dict):
            continue
        mine = out.setdefault(report.rank, {})
        for step, seconds in timings.items():
            try:
                mine[int(step)] = float(seconds)
            except (TypeError, ValueError):
                continue
    return out


def _median_without(values: list[tuple[float, int]], i: int) -> float:
    """The median of the sorted ``values`` (``(value, rank)``) without the ``i``-th."""
    m = len(values) - 1

    def at(p: int) -> float:
        return values[p if p < i else p + 1][0]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def _best(history: Mapping[int, float], window: int) -> float:
    """The lowest median of ``window`` consecutive reported steps of one rank."""
    ordered = [history[s] for s in sorted(history)]
    if len(ordered) <= window:
        return statistics.median(ordered)
    return min(statistics.median(ordered[i:i + window]) for i in range(len(ordered) - window + 1))


class _View(Protocol):
    """What :meth:`StragglerWatch.observe` reads of one catalog read (``lifeline.catalog.CatalogView`` has it):
    the generation and rank → its latest progress report (``.rank``, ``.generation``, ``.get(name)``)."""

    @property
    def generation(self) -> int: ...

    @property
    def reports(self) -> Mapping[int, Any]: ...


class StragglerWatch:
    """One job's straggler state across rounds: the ranks' samples of the current generation, the
    steps already judged and the ranks flagged (each once per generation).

    The catalog keeps each rank's latest report only; each report's ``timings`` bring its recent steps,
    merged here (the newest :data:`HISTORY_WINDOWS` × ``window`` steps kept per rank). A new generation
    starts everything afresh: a moved rank is judged on its new node.

    Args:
        spec: ``spec.recovery.straggler``.

    Attributes:
        samples: rank → {step: compute seconds} of the current generation.
        generation: the generation the samples belong to (``None`` before the first round).
        flagged: rank → its score when first flagged in the current generation.
        last: the latest verdict (``None`` before any).
        layout: the current layout, when known: ranks are compared within their pipeline stage.
    """

    def __init__(self, spec: StragglerSpec) -> None:
        self.spec = spec
        self.samples: dict[int, dict[int, float]] = {}
        self.generation: int | None = None
        self.flagged: dict[int, StragglerScore] = {}
        self.last: StragglerVerdict | None = None
        self.layout: LayoutSpec | None = None
        self._judged_through = 0

    def observe(self, view: _View, world_size: int) -> StragglerVerdict | None:
        """Take one round's reports in (ranks outside ``[0, world_size)`` are left out).

        Returns:
            The verdict when a step newer than the last judged could be judged, else ``None``.

        Raises:
            ConfigError: the spec's threshold or window is out of range (see :func:`detect_stragglers`).
        """
        if view.generation != self.generation:
            self.samples, self.flagged, self.generation, self._judged_through = {}, {}, view.generation, 0
        keep = HISTORY_WINDOWS * self.spec.window
        for rank, new in samples_of(view.reports.values(), view.generation, world_size).items():
            mine = self.samples.setdefault(rank, {})
            mine.update(new)
            for step in sorted(mine)[:-keep]:
                del mine[step]
        verdict = detect_stragglers(self.samples, threshold=self.spec.threshold, window=self.spec.window,
                                    group_of=self.group_of(world_size))
        if not verdict.steps or verdict.steps[-1] <= self._judged_through:
            return None
        self._judged_through = verdict.steps[-1]
        self.last = verdict
        return verdict

    def group_of(self, world_size: int) -> dict[int, int]:
        """rank → its pipeline stage in :attr:`layout` (stages differ in work: compared within one);
        empty when no layout is known (every rank compared with every other)."""
        return {r: stage_of(r, self.layout) for r in range(world_size)} if self.layout is not None else {}

    def flag(self, verdict: StragglerVerdict) -> list[StragglerScore]:
        """The stragglers of ``verdict`` not yet flagged this generation, now recorded in :attr:`flagged`
        (ascending rank)."""
        new = [s for s in verdict.scores if s.straggler and s.rank not in self.flagged]
        for score in new:
            self.flagged[score.rank] = score
        return new
