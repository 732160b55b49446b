"""The sidecar's only contact points with the universal format (``lifeline.checkpoint``).

Imported lazily so ``lifeline --help`` stays free of torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lifeline.errors import ChecksumError


def seal(plan: Any, blob: memoryview, *, job: str, step: int) -> str:
    """Checksum every chunk of ``blob`` per ``plan``; returns the ``ShardMetadata`` JSON."""
    from lifeline.checkpoint import seal_shard

    return seal_shard(plan, blob, job=job, step=step).to_json()


def verify(meta_json: str, blob: memoryview, *, rank: int | None = None, step: int | None = None, tier: str | None = None) -> None:
    """Re-check every chunk of ``blob`` against ``meta_json``.

    Raises:
        ChecksumError: a chunk does not match (the error names it), with rank/step/tier context.
    """
    from lifeline.checkpoint import ShardMetadata

    meta = ShardMetadata.from_json(meta_json)
    try:
        meta.verify(blob)
    except ChecksumError as err:
        raise ChecksumError(err.message, job=err.job, rank=rank, step=step, tier=tier, key=err.key) from None


def blob_nbytes(meta_json: str) -> int:
    """The blob length recorded in the metadata."""
    from lifeline.checkpoint import ShardMetadata

    return int(ShardMetadata.from_json(meta_json).nbytes)


class StreamVerifier:
    """Verifies a shard's chunks while its bytes are still arriving (overlaps checksum and transfer).

    Call :meth:`advance` with the number of bytes received so far (they must be final); a worker
    thread checks every chunk and byte entry lying wholly below that mark (crc32c releases the
    GIL). :meth:`finish` checks the rest and raises the first :class:`ChecksumError`.

    Args:
        meta_json: the shard's ``ShardMetadata`` JSON.
        buf: the destination buffer the bytes land in.
        rank, step, tier: context for errors.
    """

    def __init__(self, meta_json: str, buf: memoryview, *, rank: int, step: int, tier: str) -> None:
        import queue
        import threading

        from lifeline.checkpoint import ShardMetadata

        self.meta = ShardMetadata.from_json(meta_json)
        self.buf = buf
        self.ctx = dict(rank=rank, step=step, tier=tier)
        items = []  # (end offset, metadata restricted to one tensor or byte entry)
        for t in self.meta.tensors:
            end = max((c.byte_offset + c.byte_length for c in t.chunks), default=0)
            items.append((end, dataclasses.replace(self.meta, tensors=(t,), bytes_entries=())))
        for b in self.meta.bytes_entries:
            items.append((b.byte_offset + b.byte_length, dataclasses.replace(self.meta, tensors=(), bytes_entries=(b,))))
        self._items = sorted(items, key=lambda x: x[0])
        self._next = 0
        self._q: queue.Queue = queue.Queue()
        self.error: ChecksumError | None = None
        self._t = threading.Thread(target=self._work, daemon=True, name="stream-verify")
        self._t.start()

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                item[1].verify(self.buf)
            except ChecksumError as err:
                self.error = ChecksumError(err.message, key=err.key, **self.ctx)

    def advance(self, received: int) -> None:
        """Queue every chunk that ends at or below ``received`` bytes."""
        while self._next < len(self._items) and self._items[self._next][0] <= received:
            self._q.put(self._items[self._next])
            self._next += 1

    def finish(self) -> None:
        """Wait for every check; raises :class:`ChecksumError` (first failure) or a short-blob error."""
        self.advance(len(self.buf))
        self._q.put(None)
        self._t.join()
        if self._next < len(self._items):
            raise ChecksumError(f"blob has {len(self.buf)} bytes, metadata needs {self.meta.nbytes}", **self.ctx)
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        """Stop the worker without checking the rest (the transfer failed)."""
        self._q.put(None)
        self._t.join()
