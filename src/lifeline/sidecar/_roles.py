"""What each connection handler of the sidecar may use of it, as protocols (no import of ``server``).

:class:`~lifeline.sidecar.server.Sidecar` satisfies all three. The handlers (``_peer_conn``,
``_trainer_conn``, ``ulog``) are typed against these instead of the class, so ``server`` imports the
handlers and nothing imports ``server`` back (no circle between the modules: ``farm-studio look``),
and each handler's reach is written down: a member a handler starts to use must be added here.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from lifeline.api.pod import SidecarSettings
from lifeline.catalog import Catalog
from lifeline.checkpoint import Storage
from lifeline.errors import ChecksumError
from lifeline.sidecar._link import CatalogLink
from lifeline.sidecar._windows import WindowPersister
from lifeline.sidecar.metrics import SidecarMetrics
from lifeline.sidecar.peer import PeerClient
from lifeline.sidecar.store import Holding, Store

__all__ = ["SidecarCore", "PeerSide", "TrainerSide", "LogSide"]


class SidecarCore(Protocol):
    """What every handler reads: identity, settings, holdings, metrics, the catalog."""

    s: SidecarSettings
    job: str
    rank: int
    metrics: SidecarMetrics
    catalog: Catalog

    @property
    def store(self) -> Store:
        """The holdings (L0 shards, L1 replicas, upstream-log entries)."""

    def unpin(self, h: Holding) -> None:
        """Release a pin taken with ``store.pin``."""

    def catalog_try(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; ``None`` when the catalog is unreachable (counted, resynchronised)."""

    def report_corrupt(self, err: ChecksumError, tier: str, where: str) -> None:
        """Report a copy that failed verification and was not used."""


class PeerSide(SidecarCore, Protocol):
    """A peer connection (``_peer_conn``): receive replicas into buffers of the memory pool, serve reads."""

    secret: bytes
    stopping: threading.Event

    def take_buffer(self, nbytes: int) -> memoryview:
        """A buffer of ``nbytes`` bytes from the memory pool."""

    def give_buffer(self, buf: memoryview) -> None:
        """Return a buffer to the pool."""

    def update_gauges(self) -> None:
        """Refresh the memory gauges."""


class LogSide(SidecarCore, Protocol):
    """Upstream-log and sparse-slot operations of the trainer's connection (``ulog``)."""

    link: CatalogLink
    storage: Storage | None
    prefix: str
    repl_q: queue.Queue
    windows: WindowPersister | None

    def peer(self, rank: int, timeout: float = 30.0) -> PeerClient:
        """A connection to ``rank``'s sidecar."""


class TrainerSide(LogSide, Protocol):
    """The trainer's connection (``_trainer_conn``): lend arena slots, commit saves, restore; and what
    ``ulog`` needs, since the connection hands its log operations there."""

    @property
    def catalog_dirty(self) -> bool:
        """Whether the catalog view needs a resynchronisation."""

    def acquire_slot(self, timeout: float | None, cancelled: Callable[[], bool] | None = None) -> int | None:
        """An arena slot to write the next save into (``None``: none freed within ``timeout`` seconds,
        or ``cancelled()`` said the trainer is gone)."""

    def release_slot(self, slot: int) -> None:
        """Give back a slot that was lent and not committed."""

    def commit_slot(self, slot: int, step: int, nbytes: int, plan: Any) -> None:
        """The trainer wrote ``nbytes`` of step ``step`` into ``slot``: seal and file it."""

    def fetch(self, step: int | None, rank: int) -> tuple[Holding, str]:
        """A verified copy of ``rank``'s shard at ``step`` (latest complete when ``None``) and its tier."""
