"""Sealed shard metadata: one rank's blob layout with its crc32c checksums, and sealing (computing them).

The checkpoint-wide record, the versioned manifest, is in ``_manifest``.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from lifeline.checkpoint._crc import crc32c, crc32c_blocks
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._patterns import pattern_to_dict
from lifeline.checkpoint._shard_plan import ShardPlan, as_uint8, dtype_from_name
from lifeline.errors import ChecksumError, ManifestError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ChunkMeta",
    "TensorMeta",
    "BytesMeta",
    "ShardMetadata",
    "seal_shard",
    "seal_entries",
    "choose_block_size",
]

DEFAULT_BLOCK_SIZE = None
"""``None``: choose each chunk's checksum block size adaptively (see :func:`choose_block_size`)."""
MIN_BLOCK, MAX_BLOCK, TARGET_BLOCKS = 64, 1 << 20, 128
SMALL_BLOCK = 4096
"""Chunks whose adaptive block is below this (under 512 KiB) get blocks ending on the rows of their split dim."""


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _lowbit(n: int) -> int:
    """The largest power of two dividing ``n`` (``n`` itself when 0)."""
    return n & -n


def choose_block_size(byte_length: int, lengths: tuple[int, ...], itemsize: int, split_dim: int | None) -> int:
    """The checksum block size (bytes, a power of two in [64 B, 1 MiB]) of a chunk.

    Args:
        byte_length: the chunk's size in bytes.
        lengths: the chunk's box, elements per dim.
        itemsize: bytes per element.
        split_dim: the tensor dim the pattern splits (``None``: none; the leading dim is assumed).

    About ``byte_length / 128`` so a partial read of the chunk, widened to whole blocks,
    reads at most ~2/128 of the chunk more than it needs; at least 4 KiB for chunks of
    512 KiB and more (their block count stays at ~128). A smaller chunk's block is also
    capped at the largest power of two dividing one row of ``split_dim`` (the bytes of one
    index of that dim, ``itemsize * prod(lengths[split_dim + 1:])``), but kept at least 64 B and
    at most ~2048 blocks per chunk, so a reshard cutting the chunk between rows (any new degree)
    reads exact blocks whenever that row is a multiple of 64 B. When the pattern splits a non-leading dim of a larger chunk,
    the block is capped at half of one contiguous span of that dim (so a reshard to twice the
    degree reads exact blocks) but kept to at most 4096 blocks per chunk.
    """
    block = min(MAX_BLOCK, max(MIN_BLOCK, _pow2_floor(byte_length // TARGET_BLOCKS)))
    if block < SMALL_BLOCK:
        d = split_dim if split_dim is not None and 0 <= split_dim < len(lengths) else 0
        row = itemsize * math.prod(lengths[d + 1:])
        return min(block, max(MIN_BLOCK, _lowbit(row), _pow2_floor(byte_length // 1024)))
    if split_dim is not None and 0 < split_dim < len(lengths):
        span = itemsize
        for n in lengths[split_dim:]:
            span *= n
        half = span // 2
        lowbit = half & -half if half else block
        block = min(block, max(SMALL_BLOCK, lowbit, _pow2_floor(byte_length // 4096)))
    return block


def _readonly_view(blob: Any) -> memoryview:
    if hasattr(blob, "numpy") and not isinstance(blob, (bytes, bytearray, memoryview)):
        return memoryview(as_uint8(blob).numpy()).cast("B")
    return memoryview(blob).cast("B")


def block_crcs(data: memoryview, block_size: int) -> tuple[int, ...]:
    """crc32c of each ``block_size`` block of ``data`` (the last may be short)."""
    return tuple(crc32c_blocks(data, block_size)) if len(data) else ()


def _combine(blocks: tuple[int, ...]) -> int:
    return blocks[0] if len(blocks) == 1 else crc32c(np.asarray(blocks, dtype="<u4").tobytes())


@dataclass(frozen=True, slots=True)
class ChunkMeta:
    """A sealed chunk: the box ``offsets``/``lengths`` of the logical tensor, stored C-contiguously
    at blob bytes ``[byte_offset, byte_offset + byte_length)``.

    ``blocks`` are the crc32c of each ``block_size`` block of the chunk (the last may be
    short); ``crc32c`` is the chunk's checksum: the crc32c of the chunk itself when it is
    one block, else the crc32c of its little-endian uint32 block checksums.
    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    byte_offset: int
    byte_length: int
    crc32c: int
    block_size: int
    blocks: tuple[int, ...]

    def to_list(self) -> list:
        packed = base64.b64encode(np.asarray(self.blocks, dtype="<u4").tobytes()).decode() if len(self.blocks) > 1 else ""
        return [list(self.offsets), list(self.lengths), self.byte_offset, self.byte_length, self.crc32c,
                self.block_size, packed]

    @classmethod
    def from_list(cls, v: Sequence) -> ChunkMeta:
        offsets, lengths, bo, bl, crc, block_size, packed = v
        blocks = tuple(np.frombuffer(base64.b64decode(packed), dtype="<u4").tolist()) if packed else (int(crc),)
        if len(blocks) != max(1, -(-int(bl) // int(block_size))):
            raise ValueError(f"chunk at {offsets} lists {len(blocks)} block checksums for {bl} bytes")
        return cls(tuple(offsets), tuple(lengths), int(bo), int(bl), int(crc), int(block_size), blocks)

    def verify(self, data: memoryview, start: int = 0, *, name: str = "", rank: int | None = None) -> None:
        """Check ``data`` = chunk bytes ``[start, start + len(data))`` against the block checksums.

        ``start`` must be block-aligned and the range must end on a block boundary or the
        chunk's end. Raises :class:`ChecksumError` naming the tensor, chunk and block.
        """
        block_size = self.block_size
        if start % block_size or (start + len(data) != self.byte_length and len(data) % block_size):
            raise ChecksumError(f"unaligned verification range [{start}, {start + len(data)}) of chunk of {name!r}")
        first = start // block_size
        got = tuple(crc32c_blocks(data, block_size)) if len(data) else ()
        want = self.blocks[first : first + len(got)]
        if got != want:
            bad = first + next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
            raise ChecksumError(
                f"checksum mismatch in tensor {name!r}, chunk at offsets {list(self.offsets)} "
                f"(blob bytes {self.byte_offset}+{self.byte_length}, block {bad})",
                rank=rank, key=f"{name}@{list(self.offsets)}",
            )


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A tensor of one shard: dtype name, global shape, pattern (JSON form) and its chunks."""

    fqn: str
    dtype: str
    global_shape: tuple[int, ...]
    pattern: Mapping[str, Any]
    chunks: tuple[ChunkMeta, ...]


@dataclass(frozen=True, slots=True)
class BytesMeta:
    """A byte entry of one shard at blob bytes ``[byte_offset, +byte_length)`` with its crc32c."""

    key: str
    byte_offset: int
    byte_length: int
    crc32c: int

    def verify(self, data: memoryview, rank: int | None = None) -> None:
        """Raises :class:`ChecksumError` naming the entry when ``data`` does not match."""
        if len(data) != self.byte_length or crc32c(data) != self.crc32c:
            raise ChecksumError(f"checksum mismatch in byte entry {self.key!r}", rank=rank, key=self.key)


@dataclass(frozen=True, slots=True)
class ShardMetadata:
    """Everything one rank's blob holds, with checksums. JSON-serializable (:meth:`to_json`)."""

    job: str
    step: int
    rank: int
    layout: Layout
    nbytes: int
    tensors: tuple[TensorMeta, ...]
    bytes_entries: tuple[BytesMeta, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "step": self.step, "rank": self.rank, "layout": self.layout.to_dict(),
            "nbytes": self.nbytes,
            "tensors": {t.fqn: {"dtype": t.dtype, "shape": list(t.global_shape), "pattern": dict(t.pattern),
                                "chunks": [c.to_list() for c in t.chunks]} for t in self.tensors},
            "bytes": {b.key: [b.byte_offset, b.byte_length, b.crc32c] for b in self.bytes_entries},
        }

    def to_json(self) -> str:
        """Compact JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardMetadata:
        try:
            return cls(
                job=d["job"], step=int(d["step"]), rank=int(d["rank"]), layout=Layout.from_dict(d["layout"]),
                nbytes=int(d["nbytes"]),
                tensors=tuple(TensorMeta(fqn, t["dtype"], tuple(t["shape"]), t["pattern"],
                                         tuple(ChunkMeta.from_list(c) for c in t["chunks"]))
                              for fqn, t in d["tensors"].items()),
                bytes_entries=tuple(BytesMeta(k, int(v[0]), int(v[1]), int(v[2])) for k, v in d["bytes"].items()),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ManifestError(f"malformed shard metadata: {err!r}") from err

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any]) -> ShardMetadata:
        """Inverse of :meth:`to_json` (also accepts the dict form). Raises :class:`ManifestError`."""
        if isinstance(text, Mapping):
            return cls.from_dict(text)
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as err:
            raise ManifestError(f"shard metadata is not JSON: {err}") from err

    def mismatches(self, entry_bytes: Any) -> list[str]:
        """The tensors and byte entries whose bytes differ from the recorded checksums, in blob order.

        ``entry_bytes(byte_offset, byte_length)`` returns the bytes of the chunk or byte entry planned
        at ``byte_offset`` (e.g. ``shard_buffers(plan, state)[1]`` over a live state, so nothing is
        copied); each chunk is checksummed with its recorded block size. An empty list: the state is
        the one this metadata was sealed from, bit for bit (up to crc32c collisions)."""
        out: list[str] = []
        for t in self.tensors:
            for c in t.chunks:
                data = memoryview(entry_bytes(c.byte_offset, c.byte_length)).cast("B")
                if len(data) != c.byte_length or block_crcs(data, c.block_size) != c.blocks:
                    out.append(t.fqn)
                    break
        for b in self.bytes_entries:
            data = memoryview(entry_bytes(b.byte_offset, b.byte_length)).cast("B")
            if len(data) != b.byte_length or crc32c(data) != b.crc32c:
                out.append(b.key)
        return out

    def verify(self, blob: Any) -> None:
        """Re-check every chunk and byte entry of ``blob``; raises :class:`ChecksumError` naming the first bad one."""
        data = _readonly_view(blob)
        if len(data) < self.nbytes:
            raise ChecksumError(f"blob has {len(data)} bytes, expected {self.nbytes}", rank=self.rank, step=self.step)
        for t in self.tensors:
            for c in t.chunks:
                c.verify(data[c.byte_offset : c.byte_offset + c.byte_length], 0, name=t.fqn, rank=self.rank)
        for b in self.bytes_entries:
            b.verify(data[b.byte_offset : b.byte_offset + b.byte_length], rank=self.rank)


def seal_shard(plan: ShardPlan, blob: Any, *, job: str, step: int, block_size: int | None = DEFAULT_BLOCK_SIZE
               ) -> ShardMetadata:
    """Checksum every chunk of ``blob`` (written by ``write_shard(plan, ...)``) with crc32c.

    Each chunk is checksummed per block (the verification granularity of partial reads):
    ``block_size`` bytes (a positive multiple of 64) when given, else chosen per chunk by
    :func:`choose_block_size`. Returns frozen, JSON-serializable :class:`ShardMetadata`.
    """
    data = _readonly_view(blob)
    if len(data) < plan.nbytes:
        raise ChecksumError(f"blob has {len(data)} bytes, plan needs {plan.nbytes}", rank=plan.rank, step=step)
    return seal_entries(plan, lambda off, n: data[off : off + n], job=job, step=step, block_size=block_size)


def seal_entries(plan: ShardPlan, entry_bytes: Any, *, job: str, step: int,
                 block_size: int | None = DEFAULT_BLOCK_SIZE) -> ShardMetadata:
    """:func:`seal_shard` over any source: ``entry_bytes(byte_offset, byte_length)`` returns the bytes
    of the chunk or byte entry planned at ``byte_offset`` (e.g. straight from the state's tensors)."""
    return seal_with(plan, lambda c, bs: block_crcs(entry_bytes(c.byte_offset, c.byte_length), bs),
                     lambda b: crc32c(entry_bytes(b.byte_offset, b.byte_length)), job=job, step=step,
                     block_size=block_size)


def check_block_size(block_size: int | None) -> None:
    """Raise :class:`ManifestError` unless ``block_size`` is None or a positive multiple of 64 (bytes)."""
    if block_size is not None and (block_size <= 0 or block_size % 64):
        raise ManifestError(f"block_size={block_size} must be a positive multiple of 64")


def chunk_block_size(t: Any, c: Any, block_size: int | None) -> int:
    """The checksum block size (bytes) of chunk ``c`` of tensor plan ``t``: ``block_size`` or the adaptive choice."""
    return block_size or choose_block_size(c.byte_length, c.lengths, dtype_from_name(t.dtype).itemsize,
                                           getattr(t.pattern, "dim", None))


def seal_with(plan: ShardPlan, chunk_blocks: Any, bytes_crc: Any, *, job: str, step: int,
              block_size: int | None = DEFAULT_BLOCK_SIZE) -> ShardMetadata:
    """The :class:`ShardMetadata` of ``plan`` from checksums computed elsewhere (e.g. fused with the write).

    ``chunk_blocks(chunk_plan, block_size) -> tuple[int, ...]`` gives the crc32c of every block of a
    chunk, ``bytes_crc(bytes_plan) -> int`` the crc32c of a byte entry.
    """
    check_block_size(block_size)
    tensors = []
    for t in plan.tensors:
        chunks = []
        for c in t.chunks:
            bs = chunk_block_size(t, c, block_size)
            blocks = tuple(chunk_blocks(c, bs))
            chunks.append(ChunkMeta(c.offsets, c.lengths, c.byte_offset, c.byte_length, _combine(blocks), bs, blocks))
        tensors.append(TensorMeta(t.fqn, t.dtype, t.global_shape, pattern_to_dict(t.pattern), tuple(chunks)))
    entries = tuple(BytesMeta(b.key, b.byte_offset, b.byte_length, bytes_crc(b)) for b in plan.bytes_entries)
    return ShardMetadata(job, int(step), plan.rank, plan.layout, plan.nbytes, tuple(tensors), entries)
