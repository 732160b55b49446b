"""Sealed shard metadata (checksums) and the versioned manifest."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from lifeline.checkpoint._crc import crc32c, crc32c_blocks
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._patterns import pattern_to_dict
from lifeline.checkpoint._plan import ShardPlan, as_uint8, dtype_from_name
from lifeline.errors import ChecksumError, FormatVersionError, ManifestError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "DEFAULT_BLOCK_SIZE",
    "ChunkMeta",
    "TensorMeta",
    "BytesMeta",
    "ShardMetadata",
    "ChunkRef",
    "TensorRecord",
    "Manifest",
    "seal_shard",
    "seal_entries",
    "choose_block_size",
]

FORMAT = "lifeline-checkpoint"
FORMAT_VERSION = 1
DEFAULT_BLOCK_SIZE = None
"""``None``: choose each chunk's checksum block size adaptively (see :func:`choose_block_size`)."""
MIN_BLOCK, MAX_BLOCK, TARGET_BLOCKS = 4096, 1 << 20, 128


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def choose_block_size(byte_length: int, lengths: tuple[int, ...], itemsize: int, split_dim: int | None) -> int:
    """The checksum block size (bytes, a power of two in [4 KiB, 1 MiB]) of a chunk.

    About ``byte_length / 128`` so a partial read of the chunk, widened to whole blocks,
    reads at most ~2/128 of the chunk more than it needs. When the pattern splits a
    non-leading dim ``split_dim``, the block is also capped at half of one contiguous
    span of that dim (so a reshard to twice the degree reads exact blocks) but kept to
    at most 4096 blocks per chunk.
    """
    block = min(MAX_BLOCK, max(MIN_BLOCK, _pow2_floor(byte_length // TARGET_BLOCKS)))
    if split_dim is not None and 0 < split_dim < len(lengths):
        span = itemsize
        for n in lengths[split_dim:]:
            span *= n
        half = span // 2
        lowbit = half & -half if half else block
        block = min(block, max(MIN_BLOCK, lowbit, _pow2_floor(byte_length // 4096)))
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


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """A stored copy of a chunk: which rank's blob holds it, and the chunk itself."""

    rank: int
    chunk: ChunkMeta


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """A logical tensor of the checkpoint: dtype, global shape, the saving pattern and every stored chunk."""

    dtype: str
    shape: tuple[int, ...]
    pattern: Mapping[str, Any]
    chunks: tuple[ChunkRef, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    """The commit marker of a checkpoint: format version, job, step, layout, blobs, tensors, byte entries.

    ``blobs[r]`` is the size in bytes of rank ``r``'s blob; ``bytes_entries[r][key]`` the
    byte entries of rank ``r``.
    """

    job: str
    step: int
    layout: Layout
    blobs: tuple[int, ...]
    tensors: Mapping[str, TensorRecord]
    bytes_entries: Mapping[int, Mapping[str, BytesMeta]]
    version: int = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_shards(cls, job: str, step: int, layout: Layout, shards: Sequence[ShardMetadata]) -> Manifest:
        """Merge every rank's metadata. Raises :class:`ManifestError` naming the rank or tensor that disagrees."""
        layout.validate()
        by_rank = {s.rank: s for s in shards}
        if sorted(by_rank) != list(range(layout.world_size)) or len(shards) != layout.world_size:
            raise ManifestError(
                f"need one shard per rank 0..{layout.world_size - 1}, got ranks {sorted(s.rank for s in shards)}",
                job=job, step=step,
            )
        tensors: dict[str, TensorRecord] = {}
        for r in range(layout.world_size):
            s = by_rank[r]
            if s.job != job or s.step != step or s.layout != layout:
                raise ManifestError(f"shard of rank {r} is for job={s.job} step={s.step} layout={s.layout}",
                                    job=job, step=step, rank=r)
            for t in s.tensors:
                refs = tuple(ChunkRef(r, c) for c in t.chunks)
                prev = tensors.get(t.fqn)
                if prev is None:
                    tensors[t.fqn] = TensorRecord(t.dtype, t.global_shape, t.pattern, refs)
                elif prev.dtype != t.dtype or prev.shape != t.global_shape:
                    raise ManifestError(
                        f"tensor {t.fqn!r}: rank {r} has {t.dtype}{list(t.global_shape)}, "
                        f"another rank {prev.dtype}{list(prev.shape)}", job=job, step=step, rank=r, key=t.fqn)
                else:
                    tensors[t.fqn] = TensorRecord(prev.dtype, prev.shape, prev.pattern, prev.chunks + refs)
        return cls(
            job=job, step=int(step), layout=layout,
            blobs=tuple(by_rank[r].nbytes for r in range(layout.world_size)), tensors=tensors,
            bytes_entries={r: {b.key: b for b in by_rank[r].bytes_entries} for r in range(layout.world_size)},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": self.version, "job": self.job, "step": self.step,
            "layout": self.layout.to_dict(), "blobs": list(self.blobs),
            "tensors": {
                fqn: {"dtype": t.dtype, "shape": list(t.shape), "pattern": dict(t.pattern),
                      "chunks": [[ref.rank] + ref.chunk.to_list() for ref in t.chunks]}
                for fqn, t in sorted(self.tensors.items())
            },
            "bytes": {str(r): {k: [b.byte_offset, b.byte_length, b.crc32c] for k, b in sorted(e.items())}
                      for r, e in sorted(self.bytes_entries.items())},
            "extra": dict(self.extra),
        }

    def to_json(self) -> str:
        """Compact JSON text (the ``manifest.json`` object)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any], *, key: str | None = None) -> Manifest:
        """Parse a manifest. Raises :class:`FormatVersionError` for an unknown version and
        :class:`ManifestError` (naming ``key``) for anything unreadable or inconsistent."""
        try:
            d = text if isinstance(text, Mapping) else json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ManifestError(f"manifest is not valid JSON: {err}", key=key) from err
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest", key=key)
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise FormatVersionError(
                f"manifest format version {version!r} is not supported (this Lifeline reads version "
                f"{FORMAT_VERSION}); upgrade Lifeline", key=key)
        try:
            layout = Layout.from_dict(d["layout"])
            tensors = {}
            for fqn, t in d["tensors"].items():
                try:
                    tensors[fqn] = TensorRecord(
                        t["dtype"], tuple(int(x) for x in t["shape"]), t["pattern"],
                        tuple(ChunkRef(int(c[0]), ChunkMeta.from_list(c[1:])) for c in t["chunks"]))
                except (KeyError, TypeError, ValueError, IndexError) as err:
                    raise ManifestError(f"malformed entry of tensor {fqn!r}: {err}", key=key) from err
            entries = {int(r): {k: BytesMeta(k, int(v[0]), int(v[1]), int(v[2])) for k, v in e.items()}
                       for r, e in d["bytes"].items()}
            m = cls(job=d["job"], step=int(d["step"]), layout=layout,
                    blobs=tuple(int(n) for n in d["blobs"]), tensors=tensors, bytes_entries=entries,
                    version=version, extra=d.get("extra", {}))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ManifestError(f"malformed manifest: {err!r}", key=key) from err
        if len(m.blobs) != layout.world_size:
            raise ManifestError(f"manifest lists {len(m.blobs)} blobs for world size {layout.world_size}", key=key)
        for fqn, t in m.tensors.items():
            for ref in t.chunks:
                c = ref.chunk
                if not 0 <= ref.rank < layout.world_size or c.byte_offset + c.byte_length > m.blobs[ref.rank]:
                    raise ManifestError(f"tensor {fqn!r}: chunk {list(c.offsets)} points outside rank {ref.rank}'s blob",
                                        key=key)
        return m

    @property
    def nbytes(self) -> int:
        """Total bytes of all blobs."""
        return sum(self.blobs)
