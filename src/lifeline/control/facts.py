"""What the decision engine reads of the catalog each round: :class:`CatalogFacts`, built from one
catalog read (:meth:`lifeline.catalog.Catalog.view`, typed here as small protocols so ``control``
does not import ``catalog``). Re-exported by :mod:`lifeline.control.engine`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from lifeline.api.recovery import Holding
from lifeline.control.progress import Progress, Report
from lifeline.control.state import StoredWindows, UpstreamLog

__all__ = ["CatalogFacts"]


class _Registration(Protocol):
    @property
    def node(self) -> str: ...


class _Coverage(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def first_step(self) -> int: ...

    @property
    def last_step(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def originals_lost_to(self) -> int: ...

    @property
    def replicas_lost_to(self) -> int: ...


class _Windows(Protocol):
    """A rank's sparse windows committed to L2 (``lifeline.catalog.PersistedWindows`` has it)."""

    @property
    def rank(self) -> int: ...

    @property
    def starts(self) -> tuple[int, ...]: ...

    @property
    def window(self) -> int: ...


class _View(Protocol):
    """What :meth:`CatalogFacts.of` reads (``lifeline.catalog.CatalogView`` has it)."""

    @property
    def generation(self) -> int: ...

    @property
    def reports(self) -> Mapping[int, Report]: ...

    @property
    def beats(self) -> Mapping[int, float]: ...

    @property
    def registrations(self) -> Mapping[int, _Registration]: ...

    @property
    def holdings(self) -> frozenset[Holding]: ...

    @property
    def complete_step(self) -> int | None: ...

    @property
    def log_coverage(self) -> Iterable[_Coverage]: ...

    @property
    def windows(self) -> Iterable[_Windows]: ...


@dataclass(frozen=True)
class CatalogFacts:
    """What the catalog says of the job this round.

    Attributes:
        generation: the catalog's current generation.
        progress: the trainers' progress (:class:`~lifeline.control.progress.Progress` of that generation).
        registered: rank -> node of each live sidecar registration (the heartbeat).
        holdings: verified copies of the recent steps.
        complete_step: the latest complete step (``None``: none yet).
        upstream_logs: upstream-log coverage per rank.
        stored_windows: sparse windows committed to L2 per rank.
    """

    generation: int = 0
    progress: Progress = field(default_factory=Progress)
    registered: Mapping[int, str] = field(default_factory=dict)
    holdings: frozenset[Holding] = frozenset()
    complete_step: int | None = None
    upstream_logs: tuple[UpstreamLog, ...] = ()
    stored_windows: tuple[StoredWindows, ...] = ()

    @classmethod
    def of(cls, view: _View) -> CatalogFacts:
        """From one catalog read (:meth:`lifeline.catalog.Catalog.view`)."""
        return cls(
            generation=view.generation,
            progress=Progress.of(view.reports.values(), view.generation, view.beats),
            registered={rank: reg.node for rank, reg in view.registrations.items()},
            holdings=view.holdings,
            complete_step=view.complete_step,
            upstream_logs=tuple(UpstreamLog(c.rank, c.first_step, c.last_step, c.replicas, c.originals_lost_to,
                                             c.replicas_lost_to) for c in view.log_coverage),
            stored_windows=tuple(StoredWindows(w.rank, tuple(w.starts), w.window) for w in view.windows),
        )
