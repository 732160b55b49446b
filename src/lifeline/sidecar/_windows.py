"""The sidecar's sparse-window persister: each slot the trainer puts goes to L2, a window's manifest last.

The trainer puts one packed slot per step into the log store (``LogKey(step, 0, stage, "slot")``,
MoEvement §4 sparse checkpoints). When the sidecar persists (``LIFELINE_PERSIST_URI``), this worker
uploads each of the rank's own slots as ``<job>/windows/rank-<r>/slot-<step>.bin`` in step order
(the same S3 uploader as dense blobs), and once all W slots of a window are stored it writes the
window manifest (:func:`lifeline.checkpoint.commit_window`, the commit marker), records the rank's
committed windows in the catalog (``windows`` hash) and deletes the rank's windows older than the
previous one (two complete windows are kept, like the upstream log).

Never blocks the trainer. A slot whose upload keeps failing is retried with backoff while newer
slots wait; when more than :data:`MAX_BACKLOG` slots wait, the oldest are dropped and their window
is never committed (a later window will be). A window missing a slot (the sidecar restarted inside
it) is never committed either, and its stored slots are deleted. A slot of a window already
committed (re-captured while a restored window is re-run) is not uploaded again: committed
objects are never overwritten.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from lifeline.catalog import PersistedWindows
from lifeline.checkpoint import (
    SlotCopy,
    Storage,
    commit_window,
    delete_window,
    slot_record,
    window_manifest_key,
    window_slot_key,
    window_starts,
)
from lifeline.errors import CatalogError, LifelineError, StorageError
from lifeline.sidecar._link import CatalogLink
from lifeline.sidecar._memory import Memory
from lifeline.sidecar._verify import crc32c
from lifeline.sidecar.metrics import SidecarMetrics
from lifeline.sidecar.store import Holding

__all__ = ["WindowPersister", "MAX_BACKLOG"]

log = logging.getLogger("lifeline.sidecar.windows")

MAX_BACKLOG = 64
"""Slots waiting for L2 beyond which the oldest are dropped (their windows are never committed)."""

KEEP_WINDOWS = 2
"""Complete windows kept in L2 per rank (the newest and the one before it)."""


class WindowPersister:
    """Uploads the rank's slots to L2 and commits each complete window (see the module docstring).

    Args:
        storage, prefix, put: the L2 storage, key prefix and blob writer (the S3 uploader or ``storage.put``).
        job, rank: whose slots.
        memory: unpins each offered holding once handled.
        link: the catalog (windows record).
        metrics: bytes persisted, errors.
        stopping: set when the sidecar stops.
    """

    def __init__(self, storage: Storage, prefix: str, put: Callable[[str, memoryview], None], *, job: str, rank: int,
                 memory: Memory, link: CatalogLink, metrics: SidecarMetrics, stopping: threading.Event) -> None:
        self.storage, self.prefix, self.put = storage, prefix, put
        self.job, self.rank = job, rank
        self.memory, self.link, self.metrics, self.stopping = memory, link, metrics, stopping
        self.queue: queue.Queue[Holding | None] = queue.Queue()
        self._stored: dict[int, dict[int, SlotCopy]] = {}  # window start -> step -> stored slot
        self.committed: list[int] = []
        self._known: set[int] = set()  # starts of windows known to be committed (their manifests exist)

    def offer(self, h: Holding) -> None:
        """Persist the slot held by ``h`` (pinned by the caller; unpinned here once handled)."""
        self.queue.put(h)
        while self.queue.qsize() > MAX_BACKLOG:
            try:
                old = self.queue.get_nowait()
            except queue.Empty:
                break
            if old is not None:
                log.warning("L2 slot backlog over %d: dropping the slot of step %d", MAX_BACKLOG, old.step)
                self._forget(old.step)
                self.memory.unpin(old)

    def stop(self) -> None:
        self.queue.put(None)

    def run(self) -> None:
        while not self.stopping.is_set():
            h = self.queue.get()
            if h is None:
                return
            backoff = 0.5
            try:
                while not self.stopping.is_set():
                    try:
                        self._one(h)
                        break
                    except (StorageError, CatalogError, OSError) as err:
                        self.metrics.errors.labels("storage").inc()
                        log.warning("persisting the slot of step %d failed; retrying in %.1f s: %s", h.step,
                                    backoff, err)
                        self.stopping.wait(backoff)
                        backoff = min(backoff * 2, 10.0)
                    except LifelineError as err:  # not a slot: never retried
                        log.error("not persisting log entry of step %d: %s", h.step, err)
                        break
            finally:
                self.memory.unpin(h)

    def _one(self, h: Holding) -> None:
        view = h.buf[: h.nbytes]
        record = slot_record(view)
        if self._committed(record.start):
            return  # re-captured while re-running a restored window: L2 already holds it, never overwritten
        t0 = time.perf_counter()
        self.put(window_slot_key(self.prefix, self.job, self.rank, record.step), view)
        self.metrics.persisted_bytes.inc(h.nbytes)
        slots = self._stored.setdefault(record.start, {})
        slots[record.step] = SlotCopy(record, h.nbytes, crc32c(view))
        log.debug("persisted slot %d of window %d", record.index, record.start,
                  extra={"event": "slot_persisted", "step": record.step, "seconds": time.perf_counter() - t0})
        if record.index == record.window - 1:
            self._commit(record.start, record.window)

    def _committed(self, start: int) -> bool:
        if start not in self._known:
            if not self.storage.exists(window_manifest_key(self.prefix, self.job, self.rank, start)):
                return False
            self._known.add(start)
        return True

    def _commit(self, start: int, window: int) -> None:
        for old in [s for s in self._stored if s < start]:
            self._discard(old)  # incomplete older windows are never committed
        slots = self._stored.get(start, {})
        if sorted(slots) != list(range(start, start + window)):
            log.warning("window %d is missing slots %s: not committed", start,
                        sorted(set(range(start, start + window)) - set(slots)))
            self._discard(start)
            return
        commit_window(self.storage, self.prefix, self.job, self.rank, [slots[s] for s in sorted(slots)])
        self._stored.pop(start, None)
        starts = window_starts(self.storage, self.prefix, self.job, self.rank)
        for old in starts[:-KEEP_WINDOWS]:
            try:
                delete_window(self.storage, self.prefix, self.job, self.rank, old)
            except LifelineError as err:
                log.warning("deleting window %d failed: %s", old, err)
        self._known = set(starts[-KEEP_WINDOWS:])
        self.committed = starts[-KEEP_WINDOWS:]
        try:
            self.link.catalog.record_windows(PersistedWindows(self.rank, tuple(self.committed), window))
        except CatalogError as err:  # the next window's commit records both
            log.warning("recording window %d in the catalog failed: %s", start, err)
        log.info("committed sparse window %d..%d to L2 (manifest written last)", start, start + window - 1,
                 extra={"event": "window_committed", "step": start, "window": window})

    def _discard(self, start: int) -> None:
        """Forget an incomplete window and delete its stored slots (never committed, never read)."""
        for step in self._stored.pop(start, {}):
            try:
                self.storage.delete(window_slot_key(self.prefix, self.job, self.rank, step))
            except (StorageError, OSError) as err:
                log.warning("deleting slot %d of incomplete window %d failed: %s", step, start, err)

    def _forget(self, step: int) -> None:
        for slots in self._stored.values():
            slots.pop(step, None)
