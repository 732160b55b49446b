"""Resharding restores from memory: a ``BlobReader`` over peer sidecars (L1/L0), then storage (L2).

``lifeline.checkpoint.load_shard(manifest, reader, layout, rank, rules, into)`` reads only the byte
ranges a target rank needs; with :class:`SidecarBlobReader` those ranges come from whichever
sidecar holds the source rank's blob in memory, falling back to the next holder and finally to
object storage. The loader verifies every chunk it reads and retries the next copy on a mismatch.

Example::

    catalog = Catalog(redis_url, job, old_world_size)
    manifest = manifest_from_catalog(catalog, step)
    reader = SidecarBlobReader(catalog, secret=b"...", job=job, storage=storage, prefix=prefix)
    load_shard(manifest, reader, new_layout, new_rank, rules, into)
"""

from __future__ import annotations

import logging

from lifeline.catalog import Catalog
from lifeline.checkpoint import Manifest, ShardMetadata, Storage, blob_key
from lifeline.errors import CatalogError, ManifestError, PeerError, StorageError
from lifeline.sidecar.peer import PeerClient

__all__ = ["SidecarBlobReader", "manifest_from_catalog"]

log = logging.getLogger("lifeline.sidecar.reader")


def manifest_from_catalog(catalog: Catalog, step: int) -> Manifest:
    """The ``Manifest`` of ``step`` built from every rank's shard metadata in the catalog (no L2 needed).

    Raises:
        ManifestError: a rank's metadata is missing (the step was never complete).
    """
    metas = catalog.metas(step)
    missing = [r for r, m in enumerate(metas) if m is None]
    if missing:
        raise ManifestError(f"the catalog has no shard metadata of ranks {missing} at step {step}",
                            job=catalog.job, step=step)
    shards = [ShardMetadata.from_json(m) for m in metas if m is not None]
    return Manifest.from_shards(catalog.job, step, shards[0].layout, shards)


class SidecarBlobReader:
    """Byte ranges of rank blobs from the sidecars holding them (per the catalog), then storage.

    Args:
        catalog: the job's catalog (holders and sidecar addresses).
        secret: the job secret (bytes) for the HMAC handshake.
        job: the job name.
        storage, prefix: optional L2 fallback (``storage_from_uri``).
        source: local address to connect from (the pod IP).

    ``read`` raises :class:`StorageError` when no holder can serve the range.
    """

    def __init__(self, catalog: Catalog, *, secret: bytes, job: str, storage: Storage | None = None, prefix: str = "",
                 source: str | None = None) -> None:
        self.catalog, self.secret, self.job = catalog, secret, job
        self.storage, self.prefix, self.source = storage, prefix, source

    def _holders(self, step: int, rank: int) -> list[int]:
        try:
            holders = self.catalog.holders(step, rank)
        except CatalogError as err:
            log.warning("catalog unavailable for holders of step %d rank %d: %s", step, rank, err)
            return []
        return sorted({h.holder for h in holders if h.holder is not None})

    def read(self, step: int, rank: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of rank's blob at step (nearest holder first)."""
        errors = []
        for k in self._holders(step, rank):
            try:
                reg = self.catalog.sidecar(k)
                if reg is None:
                    continue
                with PeerClient(reg.host, reg.port, secret=self.secret, job=self.job,
                                source=self.source) as pc:
                    got, _ = pc.get(kind="shard", step=step, rank=rank, offset=offset, length=length)
                return bytes(got)
            except (PeerError, CatalogError, OSError) as err:
                errors.append(f"sidecar of rank {k}: {err}")
        if self.storage is not None:
            return self.storage.get(blob_key(self.prefix, self.job, step, rank), offset, length)
        raise StorageError(f"no holder serves bytes [{offset}, {offset + length}) of rank {rank}'s blob: "
                           f"{'; '.join(errors) or 'no holders'}", job=self.job, step=step, rank=rank)
