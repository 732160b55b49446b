"""The sidecar's link to the catalog: calls that survive a Redis outage, and the sidecar's reports."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from lifeline.api.recovery import Tier
from lifeline.catalog import Catalog, CorruptionReport
from lifeline.errors import CatalogError, ChecksumError
from lifeline.sidecar.metrics import SidecarMetrics
from lifeline.sidecar.store import Store

__all__ = ["CatalogLink"]

log = logging.getLogger("lifeline.sidecar")

T = TypeVar("T")


class CatalogLink:
    """The catalog as the sidecar's threads use it: a failed call is counted, marks the catalog for
    resynchronisation (the heartbeat re-registers every holding once Redis is back) and returns
    ``None`` instead of raising.

    Args:
        catalog: the job's catalog.
        metrics: the sidecar's metrics (``errors{kind="catalog"}``, ``latest_complete``).
        store: the holdings (its ``latest_complete`` follows the catalog's).
        rank: this sidecar's rank.
        required_tier: the tier a checkpoint must reach on every rank to be complete.
    """

    def __init__(self, catalog: Catalog, metrics: SidecarMetrics, store: Store, *, rank: int,
                 required_tier: Tier) -> None:
        self.catalog, self.metrics, self.store = catalog, metrics, store
        self.rank, self.required_tier = rank, required_tier
        self.dirty = True

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T | None:
        """``fn(*args, **kwargs)``; on a :class:`CatalogError`: counted, marked dirty, ``None``."""
        try:
            return fn(*args, **kwargs)
        except CatalogError as err:
            self.metrics.errors.labels("catalog").inc()
            if not self.dirty:
                log.warning("catalog unavailable; will resynchronise: %s", err)
            self.dirty = True
            return None

    def advance(self, step: int) -> None:
        """Ask the catalog to advance the latest complete step to ``step`` at the required tier."""
        latest = self.call(self.catalog.try_advance, step, self.required_tier, rank=self.rank,
                           floor=self.store.latest_complete)
        if latest is not None:
            self.seen_complete(latest)

    def seen_complete(self, step: int) -> None:
        """The job's latest complete step is at least ``step`` (never moves back)."""
        if step > self.store.latest_complete:
            self.store.latest_complete = step
            self.metrics.latest_complete.set(step)

    def report_corrupt(self, err: ChecksumError, tier: str, where: str) -> None:
        """Report a copy that failed verification and was not used: log, metric and catalog."""
        self.metrics.errors.labels("checksum").inc()
        log.error("corrupt copy detected and not used (%s at %s): %s", tier, where, err)
        self.call(self.catalog.report_corrupt, CorruptionReport(
            step=err.step, rank=err.rank, tier=tier, where=where, by=self.rank, chunk=err.key, error=str(err),
            time=time.time()))
