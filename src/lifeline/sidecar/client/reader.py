"""Resharding restores from memory: a ``BlobReader`` over the sidecars holding a step (L0/L1), then L2.

``lifeline.checkpoint.load_shard(manifest, reader, layout, rank, rules, into)`` reads only the byte
ranges a target rank needs; with :class:`SidecarBlobReader` those ranges come from whichever
sidecar holds the source rank's blob in memory (the reading pod's own sidecar first, then the
blob's owner, then its peers), falling back to the next holder and finally to object storage. The
loader verifies every chunk it reads against the manifest's checksums and tries the next copy on a
mismatch; :attr:`SidecarBlobReader.bytes_by_tier` counts where the bytes came from, so a restore can
show that a reshard held in memory read nothing from L2.

Example::

    catalog = Catalog(redis_url, job, saved_layout.world_size)
    manifest = manifest_from_catalog(catalog, step)
    with SidecarBlobReader(catalog, secret=b"...", job=job, storage=storage, prefix=prefix, local=rank) as reader:
        load_shard(manifest, reader, new_layout, rank, rules, into)
    reader.bytes_by_tier  # {"L0": ..., "L1": ..., "L2": 0}
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from lifeline.catalog import Catalog
from lifeline.checkpoint import Manifest, ShardMetadata, Storage, blob_key
from lifeline.errors import CatalogError, LifelineError, ManifestError, PeerError, StorageError
from lifeline.sidecar.client._client import SidecarClient
from lifeline.sidecar.peer import PeerClient

__all__ = ["SidecarBlobReader", "manifest_from_catalog"]

log = logging.getLogger("lifeline.sidecar.client.reader")


def manifest_from_catalog(catalog: Catalog, step: int, world_size: int | None = None) -> Manifest:
    """The ``Manifest`` of ``step`` built from every rank's shard metadata in the catalog (no L2 needed).

    Args:
        catalog: the job's catalog.
        step: the checkpoint's step.
        world_size: ranks of the layout the step was saved in (default: the catalog's world size;
            after an elastic reshard the saved layout's is another).

    Raises:
        ManifestError: a rank's metadata is missing (the step was never complete, or was collected).
    """
    metas = catalog.metas(step, world_size=world_size)
    missing = [r for r, m in enumerate(metas) if m is None]
    if missing:
        raise ManifestError(f"the catalog has no shard metadata of ranks {missing} at step {step}",
                            job=catalog.job, step=step)
    shards = [ShardMetadata.from_json(m) for m in metas if m is not None]
    return Manifest.from_shards(catalog.job, step, shards[0].layout, shards)


class SidecarBlobReader:
    """Byte ranges of rank blobs from the sidecars holding them in memory (per the catalog), then storage.

    A :class:`~lifeline.checkpoint.BlobReader` that also fills the caller's buffers
    (:class:`~lifeline.checkpoint.SupportsReadInto`). Holders of a blob are tried in this order: the
    sidecar of rank ``local`` (the reading pod's own, when it holds the blob), the blob's own rank
    (its L0 copy), then its L1 peers by rank; a holder that cannot serve the range (gone, refused,
    disconnected) is skipped, and storage serves it when none can. With ``local_client`` (the pod's
    :class:`~lifeline.sidecar.client.SidecarClient`), a blob the pod's own sidecar keeps in an arena
    slot is pinned once and read in place through the shared-memory arena (a memcpy; no socket, no
    copy in the sidecar); others go over TCP. Peer connections are authenticated with the job secret
    (:class:`~lifeline.sidecar.peer.PeerClient`) and kept for later reads (one per thread in flight
    per holder). Thread-safe: the loader reads on several threads. Every byte served is unverified
    here: the loader checks each chunk against the manifest and tries the next copy on a mismatch.

    Args:
        catalog: the job's catalog (holdings and sidecar registrations).
        secret: the job secret (bytes) for the HMAC handshake.
        job: the job name.
        storage, prefix: optional L2 fallback (``storage_from_uri``).
        source: local address to connect from (the pod IP).
        local: the reading pod's rank (its sidecar is tried first); ``None``: no preference.
        timeout: socket timeout of a peer connection, seconds.

    Attributes:
        bytes_by_tier: bytes served per tier, ``{"L0", "L1", "L2"}`` (L0: the blob's own rank's
            sidecar; L1: another sidecar's replica; L2: storage).
        local_bytes: of those, the bytes read in place from this pod's arena.
        fallbacks: one line per holder that failed a read (then the next one was tried).

    ``read`` / ``read_into`` raise :class:`StorageError` when no holder and no storage can serve the range.
    """

    def __init__(self, catalog: Catalog, *, secret: bytes, job: str, storage: Storage | None = None, prefix: str = "",
                 source: str | None = None, local: int | None = None, local_client: SidecarClient | None = None,
                 timeout: float = 30.0) -> None:
        self.catalog, self.secret, self.job = catalog, secret, job
        self.storage, self.prefix, self.source, self.local, self.timeout = storage, prefix, source, local, timeout
        self.local_client = local_client
        self.bytes_by_tier: dict[str, int] = {"L0": 0, "L1": 0, "L2": 0}
        self.local_bytes = 0
        self.fallbacks: list[str] = []
        self._lock = threading.Lock()
        self._holders: dict[tuple[int, int], list[int]] = {}
        self._idle: dict[int, queue.SimpleQueue[PeerClient]] = {}
        self._dead: set[int] = set()
        self._pinned: dict[tuple[int, int], tuple[int, memoryview] | None] = {}

    # --- holders and connections ------------------------------------------------------------------
    def _holders_of(self, step: int, rank: int) -> list[int]:
        with self._lock:
            cached = self._holders.get((step, rank))
        if cached is not None:
            return cached
        try:
            held = {h.holder for h in self.catalog.holders(step, rank) if h.holder is not None and h.tier != "L2"}
        except CatalogError as err:
            log.warning("catalog unavailable for holders of step %d rank %d: %s", step, rank, err)
            held = set()
        order = sorted(held, key=lambda k: (k != self.local, k != rank, k))
        with self._lock:
            self._holders[(step, rank)] = order
        return order

    def _connect(self, holder: int) -> PeerClient:
        with self._lock:
            idle = self._idle.setdefault(holder, queue.SimpleQueue())
        try:
            return idle.get_nowait()
        except queue.Empty:
            pass
        reg = self.catalog.sidecar(holder)
        if reg is None:
            raise PeerError(f"the sidecar of rank {holder} is not registered", job=self.job, rank=holder)
        return PeerClient(reg.host, reg.port, secret=self.secret, job=self.job, source=self.source,
                          timeout=self.timeout)

    def _from_arena(self, step: int, rank: int, offset: int, pieces: list[memoryview]) -> bool:
        """Fill ``pieces`` straight from this pod's sidecar's arena slot holding the blob (a memcpy, no
        socket); ``False`` when it holds none there."""
        with self._lock:  # one request at a time on the pod's socket; each blob pinned once
            if (step, rank) not in self._pinned:
                try:
                    self._pinned[(step, rank)] = self.local_client.pin_shard(step, rank)
                except (LifelineError, OSError) as err:
                    self._pinned[(step, rank)] = None
                    self.fallbacks.append(f"step {step} rank {rank}: this pod's sidecar: {err}")
            pinned = self._pinned[(step, rank)]
        if pinned is None or offset + sum(len(p) for p in pieces) > len(pinned[1]):
            return False
        at = offset
        for piece in pieces:
            piece[:] = pinned[1][at : at + len(piece)]
            at += len(piece)
        with self._lock:
            n = at - offset
            self.bytes_by_tier["L0" if self.local == rank else "L1"] += n
            self.local_bytes += n
        return True

    def _from_holders(self, step: int, rank: int, offset: int, pieces: list[memoryview]) -> bool:
        """Fill ``pieces`` (consecutive from ``offset``) from one holder; ``False`` when none could."""
        for holder in self._holders_of(step, rank):
            if holder in self._dead:
                continue
            if holder == self.local and self.local_client is not None and self._from_arena(step, rank, offset, pieces):
                return True
            try:
                client = self._connect(holder)
            except (PeerError, CatalogError, OSError) as err:
                self._note(step, rank, holder, err, dead=True)
                continue
            try:
                at = offset
                for piece in pieces:
                    got, _ = client.get(kind="shard", step=step, rank=rank, offset=at, length=len(piece), into=piece)
                    if len(got) != len(piece):
                        raise PeerError(f"short read: {len(got)} of {len(piece)} bytes", job=self.job, step=step,
                                        rank=rank)
                    at += len(piece)
            except (PeerError, OSError) as err:
                client.close()
                self._note(step, rank, holder, err, dead=not isinstance(err, PeerError) or "refused" not in str(err))
                continue
            self._idle[holder].put(client)
            with self._lock:
                self.bytes_by_tier["L0" if holder == rank else "L1"] += sum(len(p) for p in pieces)
            return True
        return False

    def _note(self, step: int, rank: int, holder: int, err: BaseException, *, dead: bool) -> None:
        with self._lock:
            self.fallbacks.append(f"step {step} rank {rank}: sidecar of rank {holder}: {err}")
            if dead:
                self._dead.add(holder)

    # --- BlobReader --------------------------------------------------------------------------------
    def read(self, step: int, rank: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of rank ``rank``'s blob at ``step`` (nearest holder first).

        Raises:
            StorageError: no holder and no storage could serve them.
        """
        buf = bytearray(length)
        self.read_into(step, rank, offset, memoryview(buf))
        return bytes(buf)

    def read_into(self, step: int, rank: int, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them filled one after the other) with rank
        ``rank``'s blob at ``step`` from byte ``offset``.

        Raises:
            StorageError: no holder and no storage could serve it.
        """
        pieces = [memoryview(b).cast("B") for b in (out if isinstance(out, list) else [out])]
        if self._from_holders(step, rank, offset, pieces):
            return
        if self.storage is None:
            raise StorageError(f"no sidecar serves bytes from {offset} of rank {rank}'s blob and no L2 store is "
                               f"configured", job=self.job, step=step, rank=rank)
        key, at = blob_key(self.prefix, self.job, step, rank), offset
        for piece in pieces:
            data = self.storage.get(key, at, len(piece))
            if len(data) != len(piece):
                raise StorageError(f"short read of {key}: {len(data)} of {len(piece)} bytes", job=self.job,
                                   step=step, rank=rank, key=key)
            piece[:] = data
            at += len(piece)
        with self._lock:
            self.bytes_by_tier["L2"] += sum(len(p) for p in pieces)

    def close(self) -> None:
        """Release every pinned arena slot and close every kept connection (idempotent)."""
        with self._lock:
            idle, self._idle = self._idle, {}
            pinned, self._pinned = self._pinned, {}
        for entry in pinned.values():
            if entry is not None:
                try:
                    self.local_client.unpin_shard(entry[0])
                except (LifelineError, OSError) as err:  # the sidecar went away: nothing stays pinned
                    log.warning("releasing arena slot %d: %s", entry[0], err)
        for q in idle.values():
            while True:
                try:
                    q.get_nowait().close()
                except queue.Empty:
                    break

    def __enter__(self) -> SidecarBlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
