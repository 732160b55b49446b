"""The load planner: for a target layout and rank, the exact reads (blob, byte range) into destination views.

Loading in the same layout, resharding A -> B and consolidation (B = one rank holding
everything) all use this planner. It intersects the target's boxes with the stored
chunks (as torch.distributed.checkpoint's default planner does with its chunk
metadata), turns each intersection into byte runs of the stored chunk, widens them to
the chunk's checksum blocks so every byte read is verified, and coalesces runs of one
blob into ranged reads while the wasted bytes stay under 3% of the bytes needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._manifest import ChunkRef, Manifest
from lifeline.checkpoint._shard_metadata import BytesMeta
from lifeline.checkpoint._patterns import Piece, intersect_boxes
from lifeline.checkpoint._shard_plan import dtype_from_name, dtype_name, local_pieces
from lifeline.checkpoint._rules import PatternRules
from lifeline.errors import LayoutError, ManifestError

__all__ = ["CopyOp", "ReadOp", "LoadPlan", "plan_load", "WASTE_BUDGET"]

WASTE_BUDGET = 0.03
"""Coalescing may read at most this fraction of the needed bytes beyond what block widening costs."""
MAX_READ = 32 << 20
"""Runs are not coalesced into reads longer than this (bytes), so reads spread over threads."""


@dataclass(frozen=True, slots=True)
class CopyOp:
    """Copy the box ``src_offsets``/``lengths`` (relative to the stored chunk) into the target.

    The destination is ``dst_offsets``/``lengths`` within the view of target tensor ``fqn``
    that ``piece`` denotes. ``copies`` are the stored copies of the chunk (same box),
    primary first. ``intervals`` are the chunk-relative, block-aligned byte ranges to read
    (covering every byte of the box); ``span`` is ``(first, end)`` byte of the box in the chunk.
    """

    fqn: str
    dtype: str
    piece: Piece
    dst_offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    chunk_lengths: tuple[int, ...]
    src_offsets: tuple[int, ...]
    copies: tuple[ChunkRef, ...]
    intervals: tuple[tuple[int, int], ...]
    span: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """Bytes the target needs from this op."""
        return math.prod(self.lengths) * dtype_from_name(self.dtype).itemsize

    @property
    def whole_chunk(self) -> bool:
        return self.lengths == self.chunk_lengths


@dataclass(frozen=True, slots=True)
class ReadOp:
    """One ranged read of rank ``rank``'s blob: bytes ``[byte_offset, +byte_length)``, serving ``ops``."""

    rank: int
    byte_offset: int
    byte_length: int
    ops: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Every read and copy that loads ``rank`` of ``layout`` from checkpoint ``step``.

    ``needed_bytes`` is what the target tensors need; ``read_bytes`` what the reads fetch (byte entries, read
    whole apart from these reads, are in neither: see :class:`~lifeline.checkpoint.LoadReport`).
    ``bytes_entries`` maps each requested byte entry to ``(source rank, its metadata)``.
    """

    step: int
    layout: Layout
    rank: int
    ops: tuple[CopyOp, ...]
    reads: tuple[ReadOp, ...]
    bytes_entries: Mapping[str, tuple[int, BytesMeta]]
    needed_bytes: int
    read_bytes: int


def _runs(offsets, lengths, shape, itemsize) -> tuple[np.ndarray, int]:
    """Start bytes of the contiguous runs of a sub-box of a C-contiguous ``shape``, and the run length."""
    nd = len(shape)
    if nd == 0:
        return np.zeros(1, dtype=np.int64), itemsize
    strides = [1] * nd
    for i in range(nd - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    k = nd - 1
    while k > 0 and lengths[k] == shape[k]:
        k -= 1
    run = lengths[k] * strides[k] * itemsize
    base = sum(o * s for o, s in zip(offsets, strides)) * itemsize
    if k == 0:
        return np.array([base], dtype=np.int64), run
    grids = np.indices(lengths[:k], dtype=np.int64).reshape(k, -1)
    starts = base + (np.asarray(strides[:k], dtype=np.int64)[:, None] * itemsize * grids).sum(axis=0)
    return starts, run


def _block_intervals(starts: np.ndarray, run: int, block: int, size: int) -> list[tuple[int, int]]:
    first = starts // block
    last = (starts + run - 1) // block
    nblocks = -(-size // block)
    marks = np.zeros(nblocks + 1, dtype=np.int64)
    np.add.at(marks, first, 1)
    np.add.at(marks, last + 1, -1)
    covered = np.cumsum(marks[:-1]) > 0
    edges = np.flatnonzero(np.diff(np.concatenate(([False], covered, [False])).astype(np.int8)))
    return [(int(a) * block, min(size, int(b) * block)) for a, b in zip(edges[::2], edges[1::2])]


def _order_copies(copies: list[ChunkRef], rank: int, same_layout: bool) -> tuple[ChunkRef, ...]:
    copies = sorted(copies, key=lambda ref: ref.rank)
    if same_layout:
        own = [c for c in copies if c.rank == rank]
        if own:
            return tuple(own + [c for c in copies if c.rank != rank])
    k = rank % len(copies)
    return tuple(copies[k:] + copies[:k])


def plan_load(
    manifest: Manifest,
    layout: Layout,
    rank: int,
    rules: PatternRules,
    into: Mapping[str, Any],
    *,
    bytes_rank: int | None = None,
) -> LoadPlan:
    """Plan loading rank ``rank`` of ``layout`` from ``manifest``.

    ``into`` maps fully qualified names to the target's local tensors (their shapes and
    dtypes decide what is read) or, for byte entries, to anything else (``None``). Byte
    entries come from ``bytes_rank`` (default: the same rank when the checkpoint has it,
    else rank 0). Raises :class:`ManifestError` naming a tensor or key the checkpoint lacks
    or does not cover, and :class:`LayoutError` naming a tensor the layout cannot take.
    """
    layout.validate()
    coords = layout.coords(rank)
    same = layout == manifest.layout
    shapes = {k: tuple(v.shape) for k, v in into.items() if isinstance(v, torch.Tensor)}
    ops: list[CopyOp] = []
    entries: dict[str, tuple[int, BytesMeta]] = {}
    src_rank = bytes_rank if bytes_rank is not None else (rank if rank < manifest.layout.world_size else 0)
    for fqn in sorted(into):
        value = into[fqn]
        if not isinstance(value, torch.Tensor):
            meta = manifest.bytes_entries.get(src_rank, {}).get(fqn)
            if meta is None:
                raise ManifestError(f"checkpoint has no byte entry {fqn!r} for rank {src_rank}",
                                    key=fqn, step=manifest.step, rank=src_rank)
            entries[fqn] = (src_rank, meta)
            continue
        record = manifest.tensors.get(fqn)
        if record is None:
            raise ManifestError(f"checkpoint has no tensor {fqn!r}", key=fqn, step=manifest.step)
        if dtype_name(value.dtype) != record.dtype:
            raise LayoutError(f"tensor {fqn!r} is {dtype_name(value.dtype)} here but {record.dtype} in the checkpoint",
                              key=fqn)
        if not value.is_contiguous():
            raise LayoutError(f"target tensor {fqn!r} must be contiguous", key=fqn)
        glob, pieces = local_pieces(fqn, rules.match(fqn), shapes[fqn], shapes, layout, coords, rules)
        if tuple(glob) != tuple(record.shape):
            raise LayoutError(
                f"tensor {fqn!r}: layout {layout} rank {rank} gives global shape {list(glob)}, "
                f"checkpoint has {list(record.shape)}", key=fqn)
        itemsize = value.element_size()
        groups: dict[tuple, list[ChunkRef]] = {}
        for ref in record.chunks:
            groups.setdefault((ref.chunk.offsets, ref.chunk.lengths), []).append(ref)
        for piece in pieces:
            covered = 0
            for (c_off, c_len), refs in groups.items():
                hit = intersect_boxes(piece.global_offsets, piece.lengths, c_off, c_len)
                if hit is None:
                    continue
                offs, lens = hit
                covered += math.prod(lens)
                src = tuple(o - c for o, c in zip(offs, c_off))
                dst = tuple(p + o - g for p, o, g in zip(piece.offsets, offs, piece.global_offsets))
                size = refs[0].chunk.byte_length
                if tuple(lens) == tuple(c_len):  # the whole chunk: one interval, nothing to compute
                    intervals, span = ((0, size),), (0, size)
                else:
                    starts, run = _runs(src, lens, c_len, itemsize)
                    intervals = tuple(_block_intervals(starts, run, refs[0].chunk.block_size, size))
                    span = (int(starts[0]), int(starts[-1]) + run)
                ops.append(CopyOp(fqn, record.dtype, piece, dst, lens, c_len, src, _order_copies(refs, rank, same),
                                  intervals, span))
            if covered != piece.numel:
                raise ManifestError(
                    f"tensor {fqn!r}: stored chunks cover {covered} of {piece.numel} elements of box "
                    f"{list(piece.global_offsets)}+{list(piece.lengths)}", key=fqn, step=manifest.step)
    reads, needed, read_bytes = _coalesce(ops)
    return LoadPlan(manifest.step, layout, rank, tuple(ops), tuple(reads), entries, needed, read_bytes)


def _coalesce(ops: list[CopyOp]) -> tuple[list[ReadOp], int, int]:
    by_rank: dict[int, list[tuple[int, int, int]]] = {}
    needed = 0
    for i, op in enumerate(ops):
        needed += op.nbytes
        primary = op.copies[0]
        for a, b in op.intervals:
            by_rank.setdefault(primary.rank, []).append((primary.chunk.byte_offset + a, primary.chunk.byte_offset + b, i))
    reads: list[ReadOp] = []
    widened = sum(b - a for ivs in by_rank.values() for a, b, _ in _dedup(ivs))
    budget = max(0, int(WASTE_BUDGET * needed) - max(0, widened - needed))
    merged_by_rank = {}
    gaps = []
    for r, ivs in by_rank.items():
        merged = []  # [start, end, ops]
        for a, b, i in sorted(ivs):
            if merged and (a < merged[-1][1] or a == merged[-1][1] and b - merged[-1][0] <= MAX_READ):
                merged[-1][1] = max(merged[-1][1], b)
                merged[-1][2].add(i)
            else:
                merged.append([a, b, {i}])
        merged_by_rank[r] = merged
        gaps.extend((merged[j + 1][0] - merged[j][1], r, j) for j in range(len(merged) - 1))
    join = set()
    for gap, r, j in sorted(gaps):
        if gap > budget:
            break
        budget -= gap
        join.add((r, j))
    total = 0
    for r, merged in sorted(merged_by_rank.items()):
        cur = None
        for j, (a, b, idx) in enumerate(merged):
            if cur is None:
                cur = [a, b, set(idx)]
            else:
                cur[1] = b
                cur[2] |= idx
            nxt = merged[j + 1] if j + 1 < len(merged) else None
            if (r, j) not in join or nxt is None or nxt[1] - cur[0] > MAX_READ:
                reads.append(ReadOp(r, cur[0], cur[1] - cur[0], tuple(sorted(cur[2]))))
                total += cur[1] - cur[0]
                cur = None
    return reads, needed, total


def _dedup(ivs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[list[int]] = []
    for a, b, i in sorted(ivs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b, i])
    return [tuple(x) for x in out]
