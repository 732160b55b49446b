"""The fused save path: checksum each segment of a blob right before it is written.

``persist_state``/``persist_shard`` on a storage with ``put_stream`` (a
:class:`SupportsPutStream`: the filesystem) pass this module's generator: it walks the blob
in order, and for every segment of at most :data:`SEGMENT` bytes computes the crc32c of its
checksum blocks and then hands it to the writer. The segment is still in the CPU cache when
the kernel copies it into the page cache, so the bytes cross the memory bus once for both
the checksum and the write, and no second thread competes for the cores (the former path
checksummed the whole blob in a thread beside the write: two passes over DRAM). Checksums are final before the object is
renamed into place, so a failure while sealing leaves no blob behind.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from lifeline.checkpoint._crc import crc32c, crc32c_blocks
from lifeline.checkpoint._shard_metadata import ShardMetadata, check_block_size, chunk_block_size, seal_with
from lifeline.checkpoint._shard_plan import BytesPlan, ChunkPlan, ShardPlan
from lifeline.checkpoint._storage import SupportsPutStream
from lifeline.errors import LayoutError

__all__ = ["SEGMENT", "fused_put"]

SEGMENT = 1 << 20
"""Bytes checksummed then written at a time (about one L2 cache; a multiple of every block size)."""


def _entries(plan: ShardPlan, block_size: int | None) -> list[tuple[int, int, Any, int | None]]:
    """``(byte_offset, byte_length, plan_entry, block_size or None for a byte entry)`` in blob order."""
    out: list[tuple[int, int, Any, int | None]] = []
    for t in plan.tensors:
        for c in t.chunks:
            out.append((c.byte_offset, c.byte_length, c, chunk_block_size(t, c, block_size)))
    out.extend((b.byte_offset, b.byte_length, b, None) for b in plan.bytes_entries)
    out.sort(key=lambda e: (e[0], e[1]))  # an empty entry may share the offset of the next
    return out


def _segments(plan: ShardPlan, block_size: int | None, view: Callable[[Any], memoryview],
              gap: Callable[[int, int], memoryview], chunk_crcs: dict[int, tuple[int, ...]],
              bytes_crcs: dict[int, int]) -> Iterator[memoryview]:
    pos = 0
    for off, n, entry, bs in _entries(plan, block_size):
        if off > pos:
            yield gap(pos, off)
        mv = view(entry)
        if len(mv) != n:
            raise LayoutError(f"entry at blob byte {off} has {len(mv)} bytes, the plan says {n}; re-plan with plan_shard")
        if bs is None:
            bytes_crcs[id(entry)] = crc32c(mv) if n else 0
            yield mv
        else:
            step = max(bs, SEGMENT // bs * bs)
            crcs: list[int] = []
            for s in range(0, n, step):
                seg = mv[s : s + step]
                crcs.extend(crc32c_blocks(seg, bs))  # cache-hot for the write that follows
                yield seg
            chunk_crcs[id(entry)] = tuple(crcs)
        pos = max(pos, off + n)
    if plan.nbytes > pos:
        yield gap(pos, plan.nbytes)


def fused_put(storage: SupportsPutStream, key: str, plan: ShardPlan, view: Callable[[ChunkPlan | BytesPlan], memoryview],
              gap: Callable[[int, int], memoryview], *, job: str, step: int,
              block_size: int | None) -> ShardMetadata:
    """Write ``plan``'s blob under ``key`` with ``storage.put_stream``, checksumming each segment just before
    it is written; returns the sealed metadata.

    ``view(entry)`` is the bytes of a chunk or byte entry, ``gap(start, stop)`` the bytes of blob
    range ``[start, stop)`` between entries (padding). An error while sealing aborts the write
    (``put_stream`` removes its temporary file), so nothing is stored.
    """
    check_block_size(block_size)
    chunk_crcs: dict[int, tuple[int, ...]] = {}
    bytes_crcs: dict[int, int] = {}
    storage.put_stream(key, _segments(plan, block_size, view, gap, chunk_crcs, bytes_crcs))
    return seal_with(plan, lambda c, bs: chunk_crcs[id(c)], lambda b: bytes_crcs[id(b)], job=job, step=step,
                     block_size=block_size)
