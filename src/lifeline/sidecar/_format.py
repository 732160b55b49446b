"""The sidecar's only contact points with the universal format (``lifeline.checkpoint``).

Imported lazily so ``lifeline --help`` stays free of torch.
"""

from __future__ import annotations

from typing import Any

from lifeline.checkpoint import ShardMetadata, seal_shard
from lifeline.errors import ChecksumError


def seal(plan: Any, blob: memoryview, *, job: str, step: int) -> str:
    """Checksum every chunk of ``blob`` per ``plan``; returns the ``ShardMetadata`` JSON."""
    return seal_shard(plan, blob, job=job, step=step).to_json()


def verify(meta_json: str, blob: memoryview, *, rank: int | None = None, step: int | None = None, tier: str | None = None) -> None:
    """Re-check every chunk of ``blob`` against ``meta_json``.

    Raises:
        ChecksumError: a chunk does not match (the error names it), with rank/step/tier context.
    """
    meta = ShardMetadata.from_json(meta_json)
    try:
        meta.verify(blob)
    except ChecksumError as err:
        raise ChecksumError(err.message, job=err.job, rank=rank, step=step, tier=tier, key=err.key) from None


def blob_nbytes(meta_json: str) -> int:
    """The blob length recorded in the metadata."""
    return int(ShardMetadata.from_json(meta_json).nbytes)
