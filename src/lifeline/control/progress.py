"""The trainers' progress as the decision engine reads it (pure; from the catalog's reports).

Runners pass the catalog's per-rank reports (:class:`lifeline.catalog.ProgressReport`, or
anything with the same attributes: :class:`Report`) to :meth:`Progress.of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

__all__ = ["Report", "Progress"]

_TRAINING_EVENTS = ("step", "save", "done", "skipped_batch", "faulty_rank")
"""Recorded events of a rank training on (the numerics check's two name a step it finished: skipped, or
re-run; docs/numerics.md)."""
_LOADED_EVENTS = ("restore", "keep", "replayed", "start", *_TRAINING_EVENTS)
"""Recorded events after which a rank's state is loaded in their generation: restored, kept (a survivor
of a localized replay), replayed, or training on."""


class Report(Protocol):
    """What the engine reads of one rank's latest progress report."""

    @property
    def event(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def time(self) -> float: ...

    @property
    def step(self) -> int | None: ...

    @property
    def error(self) -> str: ...


@dataclass(frozen=True)
class Progress:
    """The trainers' progress from their latest reports.

    Attributes:
        step: the highest step any rank reported (0 when none).
        min_step: the lowest step over the ranks that reported.
        last_time: seconds since the epoch of the newest report (``None`` when none).
        done_ranks: ranks whose latest event is ``done``.
        failures: ``(rank, detail, time)`` of ranks whose latest event is a ``failure`` in the
            generation passed to :meth:`of`.
        latest: ``(rank, generation, event, step)`` of each rank's latest report, by rank.
        times: ``(rank, time)`` of each rank's latest report (seconds since the epoch), by rank.
        beats: ``(rank, time)`` of each rank's latest recovery beat (seconds since the epoch), by
            rank: a trainer beats every second while it starts or recovers, reporting nothing else
            while it waits (for a plan, its peers, a replay).
    """

    step: int = 0
    min_step: int = 0
    last_time: float | None = None
    done_ranks: frozenset[int] = frozenset()
    failures: tuple[tuple[int, str, float], ...] = ()
    latest: tuple[tuple[int, int, str, int], ...] = ()
    times: tuple[tuple[int, float], ...] = ()
    beats: tuple[tuple[int, float], ...] = ()

    @classmethod
    def of(cls, reports: Iterable[Report], generation: int, beats: Mapping[int, float] | None = None) -> Progress:
        """Summarise the latest report of each rank; ``generation`` is the job's current one;
        ``beats``: rank -> its latest recovery beat (seconds since the epoch)."""
        reports = list(reports)
        beat_times = tuple(sorted((beats or {}).items()))
        if not reports:
            return cls(beats=beat_times)
        steps = [r.step or 0 for r in reports]
        return cls(
            step=max(steps),
            min_step=min(steps),
            last_time=max(r.time for r in reports),
            done_ranks=frozenset(r.rank for r in reports if r.event == "done"),
            failures=tuple(sorted((r.rank, r.error, r.time) for r in reports
                                  if r.event == "failure" and r.generation == generation)),
            latest=tuple(sorted((r.rank, r.generation, r.event, r.step or 0) for r in reports)),
            times=tuple(sorted((r.rank, r.time) for r in reports)),
            beats=beat_times,
        )

    @cached_property
    def last_words(self) -> dict[int, float]:
        """rank -> when it last said anything, a report or a beat (seconds since the epoch); computed
        once per round's ``Progress`` (the engine asks for every rank: one pass, not one per rank)."""
        out: dict[int, float] = {}
        for rank, at in (*self.times, *self.beats):
            out[rank] = max(at, out.get(rank, at))
        return out

    def alive_at(self, rank: int) -> float | None:
        """When ``rank`` last said anything, a report or a beat (seconds since the epoch; ``None``: never)."""
        return self.last_words.get(rank)

    @property
    def last_beat(self) -> float | None:
        """The newest recovery beat of any rank (seconds since the epoch; ``None``: none)."""
        return max((at for _, at in self.beats), default=None)

    def silent_since(self, t: float, world_size: int) -> frozenset[int]:
        """Ranks ``< world_size`` with no report or beat at or after ``t`` (seconds since the epoch):
        e.g. trainers a recovery restarted that are still starting."""
        words = self.last_words
        return frozenset(r for r in range(world_size) if words.get(r, t - 1.0) < t)

    def trained_in(self, generation: int, world_size: int) -> bool:
        """True when every rank ``< world_size`` reported a step (or finished) in ``generation``
        or later: training has resumed after the recovery that started ``generation``."""
        by_rank = {rank: (gen, event) for rank, gen, event, _ in self.latest}
        return all(rank in by_rank and by_rank[rank][0] >= generation and by_rank[rank][1] in _TRAINING_EVENTS
                   for rank in range(world_size))

    def state_step(self, generation: int, restored: Mapping[int, int]) -> int:
        """The highest step any rank's state is at, given the current ``generation``'s plan restores
        each rank of ``restored`` (rank -> its restore step, 0: the initial state): a rank whose latest
        report is older than ``generation`` (it reported reading the plan, or its old pod's last step)
        is at its restore step once it loads it — and when that load fails it never reports again,
        while the step its report names is gone from every rank that restored. 0 when none reported.

        The engine plans from it (a LocalizedReplay replays its survivors' step, fuzz regression seed
        9: after a Rollback to step 4 failed for one rank, its stale step 6 made the next plan replay
        to step 6 while the survivors were at 4)."""
        by_rank = {rank: (gen, s) for rank, gen, _, s in self.latest}
        return max((restored[rank] if gen < generation and rank in restored else s
                    for rank, (gen, s) in by_rank.items()), default=0)

    def loaded_in(self, generation: int) -> frozenset[int]:
        """Ranks whose latest report, of ``generation`` or later, says their state is loaded
        (:data:`_LOADED_EVENTS`). A rank the current plan restores that is not among them (a
        replacement still starting, a survivor still restoring) has no state a localized replay could
        keep (fuzz seed 85756845)."""
        return frozenset(rank for rank, gen, event, _ in self.latest if gen >= generation and event in _LOADED_EVENTS)

    def caught_up(self, generation: int, world_size: int, step: int) -> bool:
        """True when every rank trained past ``step`` in ``generation`` or later."""
        by_rank = {rank: (gen, event, s) for rank, gen, event, s in self.latest}
        return all(rank in by_rank and by_rank[rank][0] >= generation and by_rank[rank][1] in _TRAINING_EVENTS
                   and by_rank[rank][2] > step for rank in range(world_size))
