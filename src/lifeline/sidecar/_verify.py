"""Verifies a shard blob against its chunk checksums *while* its bytes arrive (inline, block by block).

The receiver calls :meth:`BlobVerifier.check` after every ``recv_into`` with the number of bytes
that have landed; every checksum block (``ChunkMeta.block_size`` bytes, from ``seal_shard``) and
byte entry lying wholly below that mark is checked at once, while its bytes are still hot in the
CPU cache. The acknowledgement therefore follows the last byte by one block's crc32c, and no
second pass over the blob (nor a second thread competing for the cores) is needed.

crc32c comes from ``awscrt.checksums`` (AWS's aws-checksums: AVX-512/VPCLMULQDQ folding, ~3x the
SSE4.2 instruction loop of the ``crc32c`` package on cache-hot data) when installed, else from the
checkpoint library's binding. On a mismatch the library's own ``ChunkMeta.verify`` re-checks the
range so that the error names the tensor, chunk and block exactly as everywhere else.
"""

from __future__ import annotations

from typing import Any

from lifeline.checkpoint import ShardMetadata
from lifeline.checkpoint import crc32c as _portable_crc32c
from lifeline.errors import ChecksumError


def _fast_crc32c():
    try:
        from awscrt.checksums import crc32c as aws

        probe = memoryview(b"123456789")
        if aws(probe) == 0xE3069283:  # the crc32c check value
            return aws
    except ImportError:
        pass
    return _portable_crc32c


crc32c = _fast_crc32c()


class BlobVerifier:
    """Streaming chunk-checksum verification of one shard blob.

    Args:
        meta_json: the shard's ``ShardMetadata`` JSON (as sealed by the owner's sidecar).
        buf: the buffer the blob's bytes land in (``len(buf)`` bytes are expected).
        rank, step, tier: context for errors.

    Raises:
        ChecksumError: (from :meth:`finish`) a block or byte entry does not match, or the blob is
            shorter than the metadata says.
        LifelineError, ValueError, KeyError, TypeError: the metadata JSON is unreadable (constructor).
    """

    def __init__(self, meta_json: str, buf: memoryview, *, rank: int, step: int, tier: str) -> None:
        self.meta = ShardMetadata.from_json(meta_json)
        self.buf = buf
        self.ctx = dict(rank=rank, step=step, tier=tier)
        segs: list[tuple[int, int, str, Any]] = []  # (byte offset, byte length, tensor fqn or "", chunk or byte entry)
        for t in self.meta.tensors:
            segs.extend((c.byte_offset, c.byte_length, t.fqn, c) for c in t.chunks)
        segs.extend((b.byte_offset, b.byte_length, "", b) for b in self.meta.bytes_entries)
        self._segs = sorted(segs, key=lambda s: (s[0], s[1]))
        self._i = 0  # first segment not fully verified
        self._done = 0  # bytes of that segment verified so far (a multiple of its block size)
        self.error: ChecksumError | None = None

    def check(self, received: int) -> None:
        """Verify every block and byte entry that ends at or below ``received`` bytes.

        Never raises: the first mismatch is kept (and checking stops) so that the transfer can run
        to its end and the sender gets a ``checksum`` answer; :meth:`finish` raises it.
        """
        try:
            self._check(received)
        except ChecksumError as err:
            self.error = ChecksumError(err.message, job=err.job, key=err.key, **self.ctx)
            self._i = len(self._segs)

    def _check(self, received: int) -> None:
        segs, buf = self._segs, self.buf
        while self._i < len(segs):
            off, length, fqn, item = segs[self._i]
            if fqn:  # a tensor chunk: verify its whole blocks below the mark
                avail = min(received, off + length) - off
                if avail < length:
                    avail -= avail % item.block_size
                if avail > self._done:
                    _chunk_range(item, fqn, buf, off, self._done, avail)
                    self._done = avail
                if self._done < length:
                    return
            else:  # a byte entry: one crc32c over all of it
                if off + length > received:
                    return
                _entry(item, buf[off : off + length])
            self._i += 1
            self._done = 0

    def finish(self) -> None:
        """Verify the rest; raises :class:`ChecksumError` when a check fails or bytes are missing."""
        self.check(len(self.buf))
        if self.error is not None:
            raise self.error
        if self._i < len(self._segs):
            raise ChecksumError(f"blob has {len(self.buf)} bytes, metadata needs {self.meta.nbytes}", **self.ctx)


def _entry(b: Any, data: memoryview) -> None:
    if crc32c(data) != b.crc32c:
        b.verify(data)  # raises, naming the entry
        raise ChecksumError(f"checksum mismatch in byte entry {b.key!r}", key=b.key)


def _chunk_range(c: Any, fqn: str, buf: memoryview, off: int, start: int, end: int) -> None:
    """Check chunk ``c``'s bytes ``[start, end)`` (block-aligned start; end on a block boundary or the
    chunk's end) against its block checksums; raises :class:`ChecksumError` naming the block."""
    bs, blocks = c.block_size, c.blocks
    k = start // bs
    for o in range(off + start, off + end, bs):
        if crc32c(buf[o : min(o + bs, off + end)]) != blocks[k]:
            c.verify(buf[off + start : off + end], start, name=fqn)  # raises the library's error
            raise ChecksumError(f"checksum mismatch in tensor {fqn!r}, block {k}", key=fqn)
        k += 1
