"""What a sidecar holds in memory: its own rank's checkpoints (L0) and peers' replicas (L1).

A :class:`Holding` is one verified blob: its bytes (an arena slot for the sidecar's own rank, an
anonymous buffer for a peer's replica or an upstream log), its ``ShardMetadata`` JSON and pins
(readers in progress: replication, persistence, a restore being served). The :class:`Store`
enforces the memory bound: over it, the oldest holding that is not pinned and is not part of the
job's latest complete checkpoint is evicted — never the latest complete one. A shard is evicted only
once ``release`` agrees (the sidecar forgets its catalog entry there unless a plan spared its step,
:meth:`lifeline.catalog.Catalog.spare`): the copies a published plan reads stay until it is read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Holding", "Store", "Key"]

log = logging.getLogger("lifeline.sidecar.store")
Key = tuple[str, int, int]  # (kind "shard" | "ulog:<...>", step, rank)


@dataclass(eq=False)
class Holding:
    """One blob held in memory.

    Attributes:
        kind: ``"shard"`` for a checkpoint shard, ``"ulog"`` for an upstream-log entry.
        step: training step (shards) or iteration (upstream logs).
        rank: the rank whose data this is.
        nbytes: blob length in bytes.
        buf: the bytes (a memoryview of an arena slot, or of a bytearray).
        meta: the ``ShardMetadata`` JSON (shards) or a JSON object describing the entry.
        tier: ``"L0"`` (own rank, in the arena) or ``"L1"`` (a peer's replica).
        slot: arena slot index for L0 holdings, else None.
        name: extra key part (upstream-log key), "" for shards.
    """

    kind: str
    step: int
    rank: int
    nbytes: int
    buf: memoryview
    meta: str
    tier: str
    slot: int | None = None
    name: str = ""
    pins: int = 0
    evicted: bool = field(default=False)

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.kind, self.name, self.step, self.rank)


class Store:
    """Thread-safe index of holdings with a memory bound.

    Args:
        memory_bytes: bound on the sum of ``nbytes`` of all holdings.
        on_evict: called (outside the lock) with each evicted holding, e.g. to free its arena slot
            and remove its catalog entry.
        release: asked (under the lock) about each shard chosen for eviction: ``False`` keeps it (its
            step is spared); ``None``: every shard may go.
    """

    def __init__(self, memory_bytes: int, on_evict: Callable[[Holding], None],
                 release: Callable[[Holding], bool] | None = None) -> None:
        self.memory_bytes = memory_bytes
        self._on_evict = on_evict
        self._release = release
        self._items: dict[tuple[str, str, int, int], Holding] = {}
        self.cond = threading.Condition()
        self.latest_complete: int = -1

    # -- queries -------------------------------------------------------------------------------
    def get(self, kind: str, step: int, rank: int, name: str = "") -> Holding | None:
        with self.cond:
            return self._items.get((kind, name, step, rank))

    def items(self) -> list[Holding]:
        with self.cond:
            return list(self._items.values())

    def held_bytes(self, tier: str | None = None, kind: str | None = None) -> int:
        """Sum of ``nbytes`` of the holdings (of one tier/kind when given)."""
        with self.cond:
            return sum(
                h.nbytes for h in self._items.values() if (tier is None or h.tier == tier) and (kind is None or h.kind == kind)
            )

    def steps(self, kind: str, rank: int) -> list[int]:
        """Steps held for rank, ascending."""
        with self.cond:
            return sorted(h.step for h in self._items.values() if h.kind == kind and h.rank == rank)

    # -- pins ------------------------------------------------------------------------------------
    def pin(self, kind: str, step: int, rank: int, name: str = "") -> Holding | None:
        """Pin a holding against eviction while reading it; None when not held."""
        with self.cond:
            h = self._items.get((kind, name, step, rank))
            if h is not None:
                h.pins += 1
            return h

    def unpin(self, h: Holding) -> bool:
        """Drop one pin of ``h``; ``True`` when it was the last (``h`` may be evicted now). A holding
        without pins stays at 0 (an extra unpin is a caller's bug: logged, never a negative count,
        which would keep ``h`` from eviction forever)."""
        with self.cond:
            if h.pins <= 0:
                log.error("unpin of %s step %d rank %d without a pin", h.kind, h.step, h.rank)
                return False
            h.pins -= 1
            last = h.pins == 0
            self.cond.notify_all()
        self.enforce()
        return last

    # -- changes ---------------------------------------------------------------------------------
    def _evictable(self, h: Holding, protect: set) -> bool:
        if h.pins or h.key in protect:
            return False
        return not (h.kind == "shard" and h.step == self.latest_complete)

    def _releasable(self, h: Holding) -> bool:
        """The last word on a victim that :meth:`_evictable` allowed (asked once per victim, as it goes)."""
        return h.kind != "shard" or self._release is None or self._release(h)

    def add(self, h: Holding, *, keep: int | None = None) -> None:
        """Add (or replace) a holding, then evict per ``keep`` (per kind and rank) and the bound."""
        replaced = None
        with self.cond:
            replaced = self._items.pop(h.key, None)
            self._items[h.key] = h
            self.cond.notify_all()
        if replaced is not None and replaced is not h:
            self._evict_one(replaced)
        if keep is not None:
            self.trim(h.kind, h.rank, keep)
        self.enforce(protect={h.key})

    def make_room(self, nbytes: int) -> bool:
        """Evict until ``nbytes`` more fit under the bound; False when they cannot."""
        victims = []
        with self.cond:
            total = sum(x.nbytes for x in self._items.values())
            cands = [h for h in sorted(self._items.values(), key=lambda x: x.step) if self._evictable(h, set())]
            if total - sum(h.nbytes for h in cands) + nbytes > self.memory_bytes:
                return False  # not even every evictable holding would make room: evict nothing
            for h in cands:
                if total + nbytes <= self.memory_bytes:
                    break
                if self._releasable(h):  # released holdings go even if spared ones leave too little room
                    victims.append(self._items.pop(h.key))
                    total -= h.nbytes
            ok = total + nbytes <= self.memory_bytes
        for v in victims:
            self._evict_one(v)
        return ok

    def trim(self, kind: str, rank: int, keep: int) -> None:
        """Keep only the newest ``keep`` holdings of (kind, rank) (plus pinned / latest complete)."""
        victims = []
        with self.cond:
            mine = sorted((h for h in self._items.values() if h.kind == kind and h.rank == rank), key=lambda x: x.step)
            for h in mine[:-keep] if keep > 0 else mine:
                if self._evictable(h, set()) and self._releasable(h):
                    victims.append(self._items.pop(h.key))
        for v in victims:
            self._evict_one(v)

    def enforce(self, protect: set | None = None) -> None:
        """Evict the oldest evictable holdings while over the memory bound."""
        victims = []
        with self.cond:
            total = sum(x.nbytes for x in self._items.values())
            for h in sorted(self._items.values(), key=lambda x: x.step):
                if total <= self.memory_bytes:
                    break
                if self._evictable(h, protect or set()) and self._releasable(h):
                    victims.append(self._items.pop(h.key))
                    total -= h.nbytes
        for v in victims:
            self._evict_one(v)

    def remove(self, h: Holding) -> bool:
        """Remove a specific holding (e.g. found corrupt); False if it was already gone."""
        with self.cond:
            if self._items.get(h.key) is not h:
                return False
            del self._items[h.key]
        self._evict_one(h)
        return True

    def evict_for_slot(self, rank: int) -> Holding | None:
        """Evict the oldest unpinned L0 shard of ``rank`` that is not the latest complete (to free a slot)."""
        with self.cond:
            cands = sorted(
                (h for h in self._items.values() if h.slot is not None and self._evictable(h, set())), key=lambda x: x.step
            )
            h = next((c for c in cands if self._releasable(c)), None)
            if h is None:
                return None
            self._items.pop(h.key)
        self._evict_one(h)
        return h

    def _evict_one(self, h: Holding) -> None:
        h.evicted = True
        self._on_evict(h)
        with self.cond:
            self.cond.notify_all()
