"""The sidecar's memory: the arena's slots (its own rank's checkpoints, L0), replica buffers (peers'
checkpoints, L1) and the :class:`~lifeline.sidecar.store.Store` indexing what is held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lifeline.api.pod import SidecarSettings
from lifeline.sidecar.client.arena import Arena
from lifeline.sidecar.store import Holding, Store

__all__ = ["Memory"]


class Memory:
    """Slots lent to the trainer and filled holdings, under the memory bound.

    Args:
        settings: the sidecar's settings (arena directory, slot count and size, memory bound).
        stopping: set when the sidecar stops (slot waits end).
        on_evict: called with each evicted holding after its slot or buffer was reclaimed (the
            sidecar forgets its catalog entry).
        release: asked about each shard chosen for eviction (``Store``'s ``release``): ``False`` keeps it.

    Raises:
        ConfigError: the arena cannot be allocated.
    """

    def __init__(self, settings: SidecarSettings, stopping: threading.Event,
                 on_evict: Callable[[Holding], None], release: Callable[[Holding], bool] | None = None) -> None:
        self.rank = settings.rank
        self.keep = settings.keep
        self.arena = Arena(settings.arena_dir, settings.slots, settings.slot_bytes)
        self.free_slots: list[int] = list(range(settings.slots))
        self.store = Store(settings.memory_bytes, self._evicted, release)
        self._stopping = stopping
        self._on_evict = on_evict
        self._spares: list[bytearray] = []  # at most one evicted replica buffer, reused by the next

    def acquire_slot(self, timeout: float | None, cancelled: Callable[[], bool] | None = None) -> int | None:
        """A free arena slot, evicting the oldest evictable L0 checkpoint if needed.

        Waits up to ``timeout`` seconds (``None``: forever, 0: not at all); ``None`` when none freed,
        or when ``cancelled()`` (asked every 0.5 s of waiting) says the caller is gone.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if cancelled is not None and cancelled():
                return None
            with self.store.cond:
                if self.free_slots:
                    return self.free_slots.pop(0)
            if self.store.evict_for_slot(self.rank) is not None:
                continue
            with self.store.cond:
                if self.free_slots:
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self._stopping.is_set():
                    return None
                self.store.cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    def release_slot(self, slot: int) -> None:
        """Return a slot to the free list."""
        with self.store.cond:
            if slot not in self.free_slots:
                self.free_slots.append(slot)
            self.store.cond.notify_all()

    def take_buffer(self, nbytes: int) -> memoryview:
        """A buffer of exactly ``nbytes`` for an incoming replica: a spare one of that size if any
        (already faulted in, so receiving does not page-fault), else a new one."""
        with self.store.cond:
            for i, b in enumerate(self._spares):
                if len(b) == nbytes:
                    return memoryview(self._spares.pop(i))
        return memoryview(bytearray(nbytes))

    def give_buffer(self, buf: memoryview) -> None:
        """Keep a no-longer-used replica buffer as the (single) spare for the next replica."""
        obj = buf.obj if isinstance(buf, memoryview) else buf
        if isinstance(obj, bytearray):
            with self.store.cond:
                self._spares[:] = [obj]

    def hold_slot(self, slot: int, step: int, rank: int, nbytes: int, meta: str) -> Holding:
        """Hold a filled slot as an L0 checkpoint of ``rank`` (pinned once for the caller)."""
        h = Holding("shard", step, rank, nbytes, self.arena.view(slot, nbytes), meta, "L0", slot)
        h.pins += 1
        self.store.add(h, keep=self.keep)
        return h

    def unpin(self, h: Holding) -> None:
        """Release a reader's pin; frees an evicted holding's slot once its last reader is done."""
        if self.store.unpin(h) and h.evicted and h.slot is not None:
            self.release_slot(h.slot)

    def _evicted(self, h: Holding) -> None:
        if h.slot is not None and h.pins == 0:
            self.release_slot(h.slot)
        if h.slot is None and h.pins == 0 and h.kind == "shard":
            self.give_buffer(h.buf)
        self._on_evict(h)

    def close(self, *, unlink: bool) -> None:
        """Unmap the arena (removing its files when ``unlink``)."""
        self.arena.close(unlink=unlink)
