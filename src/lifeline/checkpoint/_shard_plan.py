"""Shard plans (deterministic blob byte layout) and the one-memcpy write path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from lifeline.checkpoint._layout import Layout, RankCoords
from lifeline.checkpoint._patterns import Pattern, Piece, Zero1, zero1_pieces
from lifeline.checkpoint._rules import PatternRules
from lifeline.errors import LayoutError, StorageError

__all__ = ["ALIGN", "ChunkPlan", "TensorPlan", "BytesPlan", "ShardPlan", "plan_shard", "write_shard",
           "dtype_name", "dtype_from_name", "local_pieces", "as_uint8", "copy_into", "shard_buffers"]

ALIGN = 64
"""Every entry of a blob starts at a multiple of this many bytes."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`. Raises :class:`LayoutError` for an unknown name."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise LayoutError(f"unknown dtype {name!r}")
    return dt


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One chunk: a box of the logical tensor stored C-contiguously at ``[byte_offset, +byte_length)``.

    ``piece`` says where the box is in the rank's local tensor.
    """

    piece: Piece
    byte_offset: int
    byte_length: int

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.piece.global_offsets

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.piece.lengths


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """A tensor entry: ``local_shape`` on this rank, ``global_shape`` logically, its chunks."""

    fqn: str
    dtype: str
    local_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    pattern: Pattern
    chunks: tuple[ChunkPlan, ...]


@dataclass(frozen=True, slots=True)
class BytesPlan:
    """A byte entry (RNG state, data-loader position, scalars) at ``[byte_offset, +byte_length)``."""

    key: str
    byte_offset: int
    byte_length: int


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """The deterministic byte layout of one rank's blob (no checksums: see ``seal_shard``).

    Entries are in sorted-name order, each chunk 64-byte aligned; ``nbytes`` is the blob
    size. Reusable while the state's names, shapes and dtypes (and byte-entry lengths)
    are unchanged (:meth:`matches`).
    """

    layout: Layout
    rank: int
    tensors: tuple[TensorPlan, ...]
    bytes_entries: tuple[BytesPlan, ...]
    nbytes: int

    def matches(self, state: Mapping[str, Any]) -> bool:
        """True when ``state`` has exactly the names, shapes, dtypes and byte lengths planned."""
        if len(state) != len(self.tensors) + len(self.bytes_entries):
            return False
        for t in self.tensors:
            v = state.get(t.fqn)
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != t.local_shape or dtype_name(v.dtype) != t.dtype:
                return False
        for b in self.bytes_entries:
            v = state.get(b.key)
            if isinstance(v, torch.Tensor) or v is None or len(memoryview(v).cast("B")) != b.byte_length:
                return False
        return True


def local_pieces(
    fqn: str, pattern: Pattern, local_shape: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]],
    layout: Layout, coords: RankCoords, rules: PatternRules,
) -> tuple[tuple[int, ...], list[Piece]]:
    """``(global_shape, pieces)`` of tensor ``fqn`` with this local shape on ``coords``.

    ``shapes`` gives the local shapes of the other tensors (ZeRO-1 entries need their
    parameter's). Raises :class:`LayoutError` naming the tensor when the layout cannot take it.
    """
    try:
        if isinstance(pattern, Zero1):
            if pattern.param not in shapes:
                raise LayoutError(f"ZeRO-1 state needs its parameter {pattern.param!r} in the same state")
            param_local = tuple(shapes[pattern.param])
            inner = rules.match(pattern.param)
            if isinstance(inner, Zero1):
                raise LayoutError(f"parameter {pattern.param!r} of a ZeRO-1 entry is itself ZeRO-1")
            glob = inner.global_shape(param_local, layout)
            start, stop = Zero1.partition(math.prod(param_local), layout, coords)
            if local_shape != (stop - start,):
                raise LayoutError(
                    f"ZeRO-1 fragment has shape {list(local_shape)}, expected [{stop - start}] "
                    f"(partition {coords.data} of {layout.data} of {math.prod(param_local)} elements)"
                )
            return glob, zero1_pieces(inner.pieces(param_local, layout, coords), param_local, layout, coords)
        return pattern.global_shape(local_shape, layout), pattern.pieces(local_shape, layout, coords)
    except LayoutError as err:
        if err.key is None:
            err.key = fqn
            err.message = f"tensor {fqn!r}: {err.message}"
            err.args = (err.message,)
        raise


def plan_shard(state: Mapping[str, Any], layout: Layout, rank: int, rules: PatternRules) -> ShardPlan:
    """Plan rank ``rank``'s blob for ``state`` (fqn -> local CPU tensor or bytes-like; a ``meta`` tensor
    stands for one whose bytes come later, e.g. a streamed import).

    Raises :class:`LayoutError` naming the tensor when a pattern does not fit the layout
    (e.g. a tensor degree not dividing a sub-param size).
    """
    layout.validate()
    coords = layout.coords(rank)
    shapes = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    pos = 0
    tensors, entries = [], []
    for fqn in sorted(state):
        value = state[fqn]
        if isinstance(value, torch.Tensor):
            if value.device.type not in ("cpu", "meta"):  # meta: planned from shape and dtype alone
                raise LayoutError(f"tensor {fqn!r} is on {value.device}; pass CPU tensors", key=fqn)
            pattern = rules.match(fqn)
            glob, pieces = local_pieces(fqn, pattern, shapes[fqn], shapes, layout, coords, rules)
            itemsize = value.element_size()
            chunks = []
            for piece in pieces:
                n = piece.numel * itemsize
                if n == 0:
                    continue
                pos = _align(pos)
                chunks.append(ChunkPlan(piece, pos, n))
                pos += n
            tensors.append(TensorPlan(fqn, dtype_name(value.dtype), shapes[fqn], glob, pattern, tuple(chunks)))
        else:
            try:
                n = len(memoryview(value).cast("B"))
            except TypeError as err:
                raise LayoutError(f"entry {fqn!r} is {type(value).__name__}; pass a tensor or bytes", key=fqn) from err
            pos = _align(pos)
            entries.append(BytesPlan(fqn, pos, n))
            pos += n
    return ShardPlan(layout, rank, tuple(tensors), tuple(entries), _align(pos))


def as_uint8(buf: Any) -> torch.Tensor:
    """A 1-D uint8 tensor sharing memory with ``buf`` (tensor, memoryview, bytearray, mmap)."""
    if isinstance(buf, torch.Tensor):
        if not buf.is_contiguous():
            raise StorageError("output tensor must be contiguous")
        return buf.reshape(-1).view(torch.uint8)
    mv = memoryview(buf).cast("B")
    if mv.readonly:
        raise StorageError("output buffer is read-only")
    if len(mv) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(mv, dtype=torch.uint8)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (same shape and dtype); a plain single-threaded memcpy when both are
    contiguous (torch's intra-op threads only add contention to a memory-bound copy)."""
    if dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype and dst.numel():
        np.copyto(dst.reshape(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src)


def piece_view(flat: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The view of a flat local tensor that ``piece`` denotes."""
    base = flat[piece.base : piece.base + math.prod(piece.base_shape)].view(piece.base_shape)
    return base[tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.lengths))]


def write_shard(plan: ShardPlan, state: Mapping[str, Any], out: Any) -> None:
    """Copy every entry of ``state`` into ``out`` per ``plan``: one copy per chunk, no pickling.

    ``out`` is a writable buffer of at least ``plan.nbytes`` bytes (memoryview, mmap,
    bytearray or a contiguous tensor). Raises :class:`LayoutError` when ``state`` does not
    match the plan and :class:`StorageError` for a short or read-only buffer.
    """
    buf = as_uint8(out)
    if buf.numel() < plan.nbytes:
        raise StorageError(f"output buffer holds {buf.numel()} bytes, plan needs {plan.nbytes}")
    for t in plan.tensors:
        value = state.get(t.fqn)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != t.local_shape or dtype_name(value.dtype) != t.dtype:
            raise LayoutError(f"tensor {t.fqn!r} does not match the plan; re-plan with plan_shard", key=t.fqn)
        flat = value.reshape(-1) if value.is_contiguous() else value.contiguous().reshape(-1)
        dtype = value.dtype
        for c in t.chunks:
            dst = buf[c.byte_offset : c.byte_offset + c.byte_length].view(dtype).view(c.piece.lengths)
            copy_into(dst, piece_view(flat, c.piece))
    for b in plan.bytes_entries:
        src = np.frombuffer(memoryview(state[b.key]).cast("B"), dtype=np.uint8)
        if src.size != b.byte_length:
            raise LayoutError(f"byte entry {b.key!r} changed length; re-plan with plan_shard", key=b.key)
        if b.byte_length:
            buf[b.byte_offset : b.byte_offset + b.byte_length].numpy()[:] = src


_ZEROS = bytes(ALIGN)


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def shard_buffers(plan: ShardPlan, state: Mapping[str, Any]) -> tuple[list[memoryview], dict[int, memoryview]]:
    """The blob ``write_shard`` would produce, as a gather list over ``state``'s own memory.

    Returns ``(buffers, by_offset)``: the buffers concatenate to the blob's ``plan.nbytes``
    bytes (zero padding between entries); ``by_offset`` maps each chunk's and byte entry's
    ``byte_offset`` to its bytes (empty entries left out: one may share the offset of the next). Contiguous chunks are views (no copy); a strided chunk (e.g.
    a sub-param of a fused tensor split along a later dim) is copied once. Raises
    :class:`LayoutError` when ``state`` does not match the plan.
    """
    items: list[tuple[int, memoryview]] = []
    for t in plan.tensors:
        value = state.get(t.fqn)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != t.local_shape or dtype_name(value.dtype) != t.dtype:
            raise LayoutError(f"tensor {t.fqn!r} does not match the plan; re-plan with plan_shard", key=t.fqn)
        flat = value.reshape(-1) if value.is_contiguous() else value.contiguous().reshape(-1)
        for c in t.chunks:
            view = piece_view(flat, c.piece)
            items.append((c.byte_offset, _bytes_of(view if view.is_contiguous() else view.contiguous())))
    for b in plan.bytes_entries:
        mv = memoryview(state[b.key]).cast("B")
        if len(mv) != b.byte_length:
            raise LayoutError(f"byte entry {b.key!r} changed length; re-plan with plan_shard", key=b.key)
        items.append((b.byte_offset, mv))
    items.sort(key=lambda x: x[0])
    out: list[memoryview] = []
    pos = 0
    for off, mv in items:
        if off > pos:
            out.append(memoryview(_ZEROS)[: off - pos])
        out.append(mv)
        pos = off + len(mv)
    if plan.nbytes > pos:
        out.append(memoryview(_ZEROS)[: plan.nbytes - pos])
    return out, {off: mv for off, mv in items if len(mv)}  # an empty entry may share its offset
