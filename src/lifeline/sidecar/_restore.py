"""Restores: the nearest verified copy of a shard, from this sidecar's memory (L0), a peer's (L1) or storage (L2)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lifeline.checkpoint import Storage, SupportsGetInto, blob_key
from lifeline.errors import (
    CatalogError,
    ChecksumError,
    ConfigError,
    PeerError,
    RecoveryError,
    SidecarError,
    StorageError,
)
from lifeline.sidecar import _format
from lifeline.sidecar._link import CatalogLink
from lifeline.sidecar._memory import Memory
from lifeline.sidecar._peers import Peers
from lifeline.sidecar.store import Holding

__all__ = ["Restorer"]

log = logging.getLogger("lifeline.sidecar")

_Read = Callable[[memoryview], tuple[int, str]]


class Restorer:
    """Finds, fetches and verifies copies for the trainer's restores (invariant 4: verified reads).

    Args:
        memory: this sidecar's slots and holdings.
        link: the catalog (holders, metadata, corruption reports).
        peers: connections to peer sidecars.
        storage: the L2 store with its key prefix (``None``: no persistence configured); it must
            support ``get_into`` (every backend of ``storage_from_uri`` does).
        job, rank: whose sidecar this is.
        wait_sealed: blocks until every committed slot is sealed (a restore must see the latest save).

    Raises:
        ConfigError: ``storage`` cannot read into a buffer.
    """

    def __init__(self, memory: Memory, link: CatalogLink, peers: Peers, storage: tuple[Storage, str] | None, *,
                 job: str, rank: int, wait_sealed: Callable[[], None]) -> None:
        self.memory, self.link, self.peers = memory, link, peers
        self.job, self.rank, self.wait_sealed = job, rank, wait_sealed
        self.storage: SupportsGetInto | None = None
        self.prefix = ""
        if storage is not None:
            if not isinstance(storage[0], SupportsGetInto):
                raise ConfigError(f"the L2 store {type(storage[0]).__name__} cannot read into a buffer (get_into)",
                                  field="persist_uri")
            self.storage, self.prefix = storage[0], storage[1]

    def fetch(self, step: int | None, rank: int) -> tuple[Holding, str]:
        """The nearest verified copy of (step, rank) as a pinned holding in this sidecar, and its tier.

        Tries this sidecar's memory (``L0``), then peers holding it (``L1``), then storage (``L2``);
        every copy is verified against the chunk checksums before use, and a corrupt copy is
        reported (log, metric, catalog) and skipped. ``step=None`` means the latest complete step.

        Raises:
            RecoveryError: no tier holds a verified copy.
        """
        self.wait_sealed()
        store, catalog = self.memory.store, self.link.catalog
        if step is None:
            step = self.link.call(catalog.latest_complete_step)
            if step is None:
                held = store.steps("shard", rank)
                if not held:
                    raise RecoveryError("no complete checkpoint to restore", job=self.job, rank=rank)
                step = held[-1]
        errors: list[str] = []
        h = store.pin("shard", step, rank)
        if h is not None:
            try:
                _format.verify(h.meta, h.buf, rank=rank, step=step, tier="L0")
                if h.slot is not None:
                    log.info("restored step %d rank %d from %s", step, rank, "L0")
                    return h, "L0"
                try:  # a replica held for a peer: copy it into a slot the trainer can map
                    return self._into_slot(step, rank, h.meta, "L0", lambda v, h=h: _copy(h, v)), "L0"
                finally:
                    self.memory.unpin(h)
            except ChecksumError as err:
                self.memory.unpin(h)
                self.link.report_corrupt(err, "L0", f"local@{self.rank}")
                store.remove(h)
                errors.append(str(err))
                self._scrub(rank)
        meta = self.link.call(catalog.meta, step, rank)
        holders = self.link.call(catalog.holders, step, rank) or frozenset()
        for k in sorted({h.holder for h in holders if h.holder is not None} - {self.rank}):
            try:
                return self._into_slot(step, rank, meta, "L1", lambda v, k=k: self._from_peer(k, step, rank, v)), "L1"
            except ChecksumError as err:
                errors.append(f"rank {k}: {err}")
                self._drop_corrupt(k, step, rank)
            except (PeerError, SidecarError) as err:
                errors.append(f"rank {k}: {err}")
                if getattr(err, "missing", False):  # the catalog was wrong (a holder's earlier incarnation)
                    for tier in ("L0", "L1"):
                        self.link.call(catalog.remove_holding, step, rank, tier, k)
        if self.storage is not None:
            try:
                return self._into_slot(step, rank, meta, "L2", lambda v: self._from_storage(step, rank, v)), "L2"
            except ChecksumError as err:  # reported; forgotten so that the next plan picks another copy
                errors.append(f"L2: {err}")
                self.link.call(catalog.remove_holding, step, rank, "L2", None)
            except (StorageError, SidecarError) as err:
                errors.append(f"L2: {err}")
        raise RecoveryError(f"no verified copy of step {step} rank {rank}: {'; '.join(errors) or 'no holders'}",
                            job=self.job, rank=rank, step=step)

    def _scrub(self, rank: int) -> int:
        """After one of ``rank``'s copies in this sidecar failed verification, verify every other copy of
        ``rank`` it holds (they share the arena) and drop the corrupt ones — reported, and forgotten by the
        catalog — before the failed restore is answered, so that the plan made next cannot name one
        (fuzz seed 804: an L0 flip of both slots cost one extra recovery per slot). Returns how many
        were dropped. Costs one checksum pass over the rank's copies (memory bandwidth), only after a
        detected corruption."""
        dropped = 0
        for step in self.memory.store.steps("shard", rank):
            h = self.memory.store.pin("shard", step, rank)
            if h is None:
                continue
            try:
                _format.verify(h.meta, h.buf, rank=rank, step=step, tier=h.tier)
            except ChecksumError as err:
                self.memory.unpin(h)  # first: the removal then frees its slot or buffer
                self.link.report_corrupt(err, h.tier, f"local@{self.rank} (scrubbed)")
                dropped += self.memory.store.remove(h)
            else:
                self.memory.unpin(h)
        return dropped

    def _from_peer(self, k: int, step: int, rank: int, view: memoryview) -> tuple[int, str]:
        with self.peers.connect(k) as pc:
            got, meta = pc.get(kind="shard", step=step, rank=rank, into=view)
            return len(got), meta

    def _from_storage(self, step: int, rank: int, view: memoryview) -> tuple[int, str]:
        assert self.storage is not None
        meta = self.link.call(self.link.catalog.meta, step, rank)
        if meta is None:
            raise SidecarError("no shard metadata in the catalog for the stored blob", rank=rank, step=step, tier="L2")
        n = _format.blob_nbytes(meta)
        if n > len(view):
            raise SidecarError(f"stored blob of {n} bytes exceeds LIFELINE_SLOT_BYTES", rank=rank, step=step)
        self.storage.get_into(blob_key(self.prefix, self.job, step, rank), 0, view[:n])
        return n, meta

    def _into_slot(self, step: int, rank: int, meta: str | None, tier: str, read: _Read) -> Holding:
        slot = self.memory.acquire_slot(timeout=60.0)
        if slot is None:
            raise SidecarError("no free arena slot to restore into", rank=rank, step=step)
        try:
            nbytes, peer_meta = read(self.memory.arena.view(slot))
            meta = meta or peer_meta
            if not meta:
                raise SidecarError("no shard metadata to verify against", rank=rank, step=step, tier=tier)
            try:
                _format.verify(meta, self.memory.arena.view(slot, nbytes), rank=rank, step=step, tier=tier)
            except ChecksumError as err:
                self.link.report_corrupt(err, tier, "storage" if tier == "L2" else "peer")
                raise
        except BaseException:
            self.memory.release_slot(slot)
            raise
        h = self.memory.hold_slot(slot, step, rank, nbytes, meta)
        self.link.call(self.link.catalog.add_holding, step, rank, "L0", self.rank, meta)
        log.info("restored step %d rank %d from %s", step, rank, tier)
        return h

    def _drop_corrupt(self, k: int, step: int, rank: int) -> None:
        """Forget rank k's corrupt copy of (step, rank): catalog first, then ask k to delete it (best effort)."""
        for tier in ("L0", "L1"):
            self.link.call(self.link.catalog.remove_holding, step, rank, tier, k)
        try:
            with self.peers.connect(k, timeout=5.0) as pc:
                pc.delete(kind="shard", step=step, rank=rank)
        except (PeerError, CatalogError, OSError) as err:
            log.warning("could not ask rank %d to drop its corrupt copy of step %d rank %d: %s", k, step, rank, err)


def _copy(h: Holding, view: memoryview) -> tuple[int, str]:
    view[: h.nbytes] = h.buf[: h.nbytes]
    return h.nbytes, h.meta
