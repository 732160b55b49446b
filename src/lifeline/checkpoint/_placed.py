"""The ``placed`` pattern: a DTensor's shard, described by its global shape and placements.

A ``torch.distributed.tensor.DTensor`` (FSDP2's ``fully_shard`` parameters and their optimizer
state, tensor-parallel ``distribute_tensor`` weights) carries its own layout: a global shape, a
device mesh and one placement per mesh dimension (``Shard(dim)`` or ``Replicate()``). The pattern
records exactly that, with each mesh dimension named by the layout axis it runs along (``data``
for FSDP, ``tensor`` for tensor parallelism), so it is independent of the degrees: the same record
gives a rank's box at world size 4 and at world size 2, which is what lets a checkpoint saved at N
load at M (DESIGN.md "Universal format"; UCP's patterns, derived here from the tensor itself rather
than from a name rule).

Shards follow ``torch.chunk`` (DTensor's ``Shard``): along the sharded dim of size ``n`` over ``k``
ranks each rank holds ``ceil(n / k)`` rows, the last ones fewer or none. Mesh dimensions apply in
order; a tensor dim sharded by two mesh dims is chunked by the first, then its chunk by the second.
"""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.checkpoint._layout import Layout, RankCoords
from lifeline.checkpoint._piece import Piece
from lifeline.errors import LayoutError

__all__ = ["AXES", "Placed"]

AXES = ("tensor", "pipeline", "data", "expert")
"""The layout axes a mesh dimension may run along."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A DTensor's pattern: global ``shape``; per mesh dimension ``i``, the layout axis ``axes[i]`` it
    runs along and ``shards[i]``, the tensor dim it shards (``None``: replicated along it).

    Args:
        shape: the logical (global) tensor's shape, elements per dim.
        axes: one of :data:`AXES` per mesh dimension, each at most once.
        shards: per mesh dimension a tensor dim in ``[0, len(shape))`` or ``None``.

    Raises:
        LayoutError: an unknown or repeated axis, ``axes``/``shards`` of different lengths, or a
            shard dim out of range.
    """

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    shards: tuple[int | None, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "axes", tuple(str(a) for a in self.axes))
        object.__setattr__(self, "shards", tuple(None if d is None else int(d) for d in self.shards))
        if len(self.axes) != len(self.shards):
            raise LayoutError(f"placed pattern: {len(self.axes)} mesh axes but {len(self.shards)} placements")
        for axis in self.axes:
            if axis not in AXES or self.axes.count(axis) > 1:
                raise LayoutError(f"placed pattern: mesh axis {axis!r} must be one of {AXES}, each once",
                                  key=axis)
        for d in self.shards:
            if d is not None and not 0 <= d < len(self.shape):
                raise LayoutError(f"placed pattern: shard dim {d} out of range for shape {list(self.shape)}")

    @property
    def dim(self) -> int | None:
        """The first tensor dim a mesh dimension shards (``None``: replicated); chooses checksum blocks."""
        return next((d for d in self.shards if d is not None), None)

    def box(self, layout: Layout, coords: RankCoords) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(offsets, lengths)`` of the rank's box of the global tensor, in elements (lengths may be 0)."""
        offsets, lengths = [0] * len(self.shape), list(self.shape)
        for axis, d in zip(self.axes, self.shards):
            if d is None:
                continue
            degree, index = getattr(layout, axis), getattr(coords, axis)
            size = lengths[d]
            chunk = -(-size // degree) if size else 0
            start = min(index * chunk, size)
            offsets[d] += start
            lengths[d] = max(0, min(chunk, size - start))
        return tuple(offsets), tuple(lengths)

    def global_shape(self, local: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        """The recorded global shape (the local shape is checked against it in :meth:`pieces`)."""
        if len(local) != len(self.shape):
            raise LayoutError(f"placed pattern: local shape {list(local)} has not the {len(self.shape)} dims "
                              f"of global shape {list(self.shape)}")
        return self.shape

    def local_shape(self, glob: tuple[int, ...], layout: Layout, coords: RankCoords) -> tuple[int, ...]:
        """The rank's local shape; ``glob`` must be the recorded shape."""
        if tuple(glob) != self.shape:
            raise LayoutError(f"placed pattern of shape {list(self.shape)} asked for global shape {list(glob)}")
        return self.box(layout, coords)[1]

    def pieces(self, local: tuple[int, ...], layout: Layout, coords: RankCoords) -> list[Piece]:
        """One piece, the rank's whole local tensor at its box (none when the box is empty).

        Raises:
            LayoutError: ``local`` is not the box's shape (the DTensor's mesh is not this layout's).
        """
        offsets, lengths = self.box(layout, coords)
        if tuple(local) != lengths:
            raise LayoutError(f"local shard of shape {list(local)} is not the {list(lengths)} that layout "
                              f"{layout.to_dict()} gives rank coordinates {coords} for placements "
                              f"{list(zip(self.axes, self.shards))} of shape {list(self.shape)}")
        if 0 in lengths:
            return []
        return [Piece(0, lengths, (0,) * len(lengths), lengths, offsets)]
