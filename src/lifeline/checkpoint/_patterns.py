"""Layout patterns: how a rank's local tensor maps into its logical (global) tensor.

After Universal Checkpointing (Lian et al., 2024, §3 "UCP patterns"): a model declares
once, as a table of name rules (:class:`PatternRules`, in ``_rules``), each parameter's
pattern; the planner derives every rank's boxes from the pattern, the layout and the
rank's coordinates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Union

from lifeline.checkpoint._layout import Layout, RankCoords
from lifeline.checkpoint._piece import Piece
from lifeline.checkpoint._placed import Placed
from lifeline.errors import LayoutError

__all__ = [
    "Replicated",
    "Sharded",
    "SubParams",
    "Padded",
    "Expert",
    "Zero1",
    "Placed",
    "Pattern",
    "Piece",
    "flat_range_boxes",
    "intersect_boxes",
    "zero1_pieces",
    "pattern_to_dict",
    "pattern_from_dict",
]


def _whole(shape: tuple[int, ...], global_offsets: tuple[int, ...] | None = None) -> Piece:
    zeros = (0,) * len(shape)
    return Piece(0, shape, zeros, shape, global_offsets if global_offsets is not None else zeros)


def _check_dim(name: str, dim: int, shape: tuple[int, ...]) -> None:
    if not 0 <= dim < len(shape):
        raise LayoutError(f"{name}: dim {dim} out of range for a tensor of shape {list(shape)}")


@dataclass(frozen=True, slots=True)
class Replicated:
    """Every rank holds the whole tensor (layer norms, biases of row-parallel layers, scalars).

    Every pattern (except :class:`Zero1`, which the planner resolves through its parameter)
    answers three questions, each raising :class:`LayoutError` when the layout cannot take
    the tensor:
    """

    def global_shape(self, local: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        """The logical tensor's shape, given a rank's local shape."""
        return local

    def local_shape(self, glob: tuple[int, ...], layout: Layout, coords: RankCoords) -> tuple[int, ...]:
        """The local shape the rank at ``coords`` holds of a logical tensor of shape ``glob``."""
        return glob

    def pieces(self, local: tuple[int, ...], layout: Layout, coords: RankCoords) -> list[Piece]:
        """The boxes of the local tensor and where each sits in the logical tensor."""
        return [_whole(local)]


@dataclass(frozen=True, slots=True)
class Sharded:
    """Split evenly along ``dim`` across the tensor-parallel degree (column/row-parallel linears)."""

    dim: int

    def global_shape(self, local, layout):
        _check_dim("Sharded", self.dim, local)
        return local[: self.dim] + (local[self.dim] * layout.tensor,) + local[self.dim + 1 :]

    def local_shape(self, glob, layout, coords):
        _check_dim("Sharded", self.dim, glob)
        if glob[self.dim] % layout.tensor:
            raise LayoutError(
                f"tensor degree {layout.tensor} does not divide dim {self.dim} of size {glob[self.dim]}"
            )
        return glob[: self.dim] + (glob[self.dim] // layout.tensor,) + glob[self.dim + 1 :]

    def pieces(self, local, layout, coords):
        off = [0] * len(local)
        off[self.dim] = coords.tensor * local[self.dim]
        return [_whole(local, tuple(off))]


@dataclass(frozen=True, slots=True)
class SubParams:
    """A fused tensor of uneven parts along ``dim`` (QKV with GQA, SwiGLU gate/up).

    The logical tensor is the concatenation of the full parts, ``sizes`` long each along
    ``dim``; each part is split evenly across tensor-parallel ranks, and a rank's local
    tensor concatenates its slice of every part (Megatron's fused layout; UCP
    ``params_to_average``/sub-param pattern).
    """

    dim: int
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))

    def _check(self, layout: Layout) -> None:
        for i, size in enumerate(self.sizes):
            if size % layout.tensor:
                raise LayoutError(f"tensor degree {layout.tensor} does not divide sub-param {i} of size {size}")

    def global_shape(self, local, layout):
        _check_dim("SubParams", self.dim, local)
        self._check(layout)
        if local[self.dim] * layout.tensor != sum(self.sizes):
            raise LayoutError(
                f"local size {local[self.dim]} along dim {self.dim} x tensor degree {layout.tensor} "
                f"!= sum of sub-param sizes {list(self.sizes)}"
            )
        return local[: self.dim] + (sum(self.sizes),) + local[self.dim + 1 :]

    def local_shape(self, glob, layout, coords):
        _check_dim("SubParams", self.dim, glob)
        self._check(layout)
        if glob[self.dim] != sum(self.sizes):
            raise LayoutError(f"dim {self.dim} of size {glob[self.dim]} != sum of sub-param sizes {list(self.sizes)}")
        return glob[: self.dim] + (sum(self.sizes) // layout.tensor,) + glob[self.dim + 1 :]

    def pieces(self, local, layout, coords):
        out, loc, glo = [], 0, 0
        for size in self.sizes:
            part = size // layout.tensor
            if part:
                offsets, goff, lengths = [0] * len(local), [0] * len(local), list(local)
                offsets[self.dim], goff[self.dim], lengths[self.dim] = loc, glo + coords.tensor * part, part
                out.append(Piece(0, local, tuple(offsets), tuple(lengths), tuple(goff)))
            loc += part
            glo += size
        return out


@dataclass(frozen=True, slots=True)
class Padded:
    """A vocabulary padded along ``dim``; only the first ``logical_size`` rows are the real tensor.

    With ``sharded=True`` (vocab-parallel embedding / output layer) the padded tensor is
    split along ``dim`` across tensor-parallel ranks. Padding rows are neither stored nor
    loaded: on load they keep the target tensor's values.
    """

    dim: int
    logical_size: int
    sharded: bool = True

    def global_shape(self, local, layout):
        _check_dim("Padded", self.dim, local)
        padded = local[self.dim] * (layout.tensor if self.sharded else 1)
        if padded < self.logical_size:
            raise LayoutError(f"padded size {padded} along dim {self.dim} < logical size {self.logical_size}")
        return local[: self.dim] + (self.logical_size,) + local[self.dim + 1 :]

    def local_shape(self, glob, layout, coords, multiple: int = 1):
        _check_dim("Padded", self.dim, glob)
        degree = layout.tensor if self.sharded else 1
        step = degree * multiple
        padded = -(-self.logical_size // step) * step
        return glob[: self.dim] + (padded // degree,) + glob[self.dim + 1 :]

    def pieces(self, local, layout, coords):
        rows = local[self.dim]
        start = coords.tensor * rows if self.sharded else 0
        keep = max(0, min(rows, self.logical_size - start))
        if keep == 0:
            return []
        lengths = list(local)
        lengths[self.dim] = keep
        goff = [0] * len(local)
        goff[self.dim] = start
        return [Piece(0, local, (0,) * len(local), tuple(lengths), tuple(goff))]


@dataclass(frozen=True, slots=True)
class Expert:
    """Expert ``index`` of MoE ``layer``; the fqn names the global expert index.

    With ``num_experts`` given, expert ranks own contiguous blocks of
    ``num_experts / expert_degree`` experts and a rank holding an expert it does not own
    is a :class:`LayoutError`. ``dim`` additionally shards the expert across tensor-parallel
    ranks. In regex rules, ``layer``/``index`` left ``None`` are filled from the named
    groups ``(?P<layer>..)``/``(?P<index>..)``.
    """

    layer: int | None = None
    index: int | None = None
    num_experts: int | None = None
    dim: int | None = None

    def resolve(self, match: re.Match) -> Expert:
        groups = match.groupdict()
        layer = self.layer if self.layer is not None or "layer" not in groups else int(groups["layer"])
        index = self.index if self.index is not None or "index" not in groups else int(groups["index"])
        return replace(self, layer=layer, index=index)

    def owner(self, layout: Layout) -> int | None:
        """The expert-parallel coordinate that owns this expert (``None`` without ``num_experts``)."""
        if self.num_experts is None or self.index is None:
            return None
        if self.num_experts % layout.expert:
            raise LayoutError(f"expert degree {layout.expert} does not divide num_experts={self.num_experts}")
        return self.index // (self.num_experts // layout.expert)

    def _check_owner(self, layout: Layout, coords: RankCoords) -> None:
        owner = self.owner(layout)
        if owner is not None and owner != coords.expert:
            raise LayoutError(
                f"expert {self.index} of layer {self.layer} belongs to expert rank {owner}, not {coords.expert}"
            )

    def global_shape(self, local, layout):
        return local if self.dim is None else Sharded(self.dim).global_shape(local, layout)

    def local_shape(self, glob, layout, coords):
        self._check_owner(layout, coords)
        return glob if self.dim is None else Sharded(self.dim).local_shape(glob, layout, coords)

    def pieces(self, local, layout, coords):
        self._check_owner(layout, coords)
        return [_whole(local)] if self.dim is None else Sharded(self.dim).pieces(local, layout, coords)


@dataclass(frozen=True, slots=True)
class Zero1:
    """ZeRO-1 optimizer state: a data-parallel rank's flat partition of one parameter's state.

    The state (e.g. Adam ``exp_avg``) is shaped like parameter ``param`` (this rank's
    tensor-parallel local shape, pattern from the same rules); flattened, it is split
    into ``data`` contiguous partitions of ``ceil(numel / data)`` elements (the last may
    be shorter or empty) and this rank's local tensor is partition ``coords.data``, 1-D.
    This is the per-parameter view of DeepSpeed's flat buffer that Universal
    Checkpointing's *extract* step produces (Lian et al., 2024, §3.2). ``param`` in a
    rule may use ``\\1``/``\\g<name>`` references to the rule's groups.
    """

    param: str

    def resolve(self, match: re.Match) -> Zero1:
        return replace(self, param=match.expand(self.param))

    @staticmethod
    def partition(numel: int, layout: Layout, coords: RankCoords) -> tuple[int, int]:
        """``(start, stop)`` element range of the flat state that ``coords.data`` holds."""
        size = -(-numel // layout.data)
        start = min(numel, coords.data * size)
        return start, min(numel, start + size)


Pattern = Union[Replicated, Sharded, SubParams, Padded, Expert, Zero1, Placed]


def flat_range_boxes(shape: tuple[int, ...], start: int, stop: int) -> list[tuple[int, tuple, tuple]]:
    """Split the C-order flat range ``[start, stop)`` of ``shape`` into boxes.

    Returns ``(flat_offset_of_box_start - start, offsets, lengths)`` per box; each box is
    contiguous in flat order. At most ``2 * ndim - 1`` boxes.
    """
    out: list[tuple[int, tuple, tuple]] = []
    if start >= stop:
        return out
    if len(shape) == 0:
        return [(0, (), ())]
    inner = math.prod(shape[1:])
    if inner == 0:
        return out
    if start % inner == 0 and stop % inner == 0:  # whole rows (always the case in 1-D)
        return [(0, (start // inner,) + (0,) * (len(shape) - 1), ((stop - start) // inner,) + tuple(shape[1:]))]
    pos = start
    while pos < stop:
        row = pos // inner
        row_start, row_end = row * inner, (row + 1) * inner
        if pos == row_start and stop >= row_end:
            nrows = (stop - pos) // inner
            out.append((pos - start, (row,) + (0,) * (len(shape) - 1), (nrows,) + tuple(shape[1:])))
            pos += nrows * inner
        else:
            end = min(stop, row_end)
            for rel, offs, lens in flat_range_boxes(tuple(shape[1:]), pos - row_start, end - row_start):
                out.append((pos - start + rel, (row,) + offs, (1,) + lens))
            pos = end
    return out


def intersect_boxes(a_off: tuple[int, ...], a_len: tuple[int, ...], b_off: tuple[int, ...], b_len: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(offsets, lengths)`` of the intersection of boxes ``a`` and ``b`` (element units), None when empty."""
    offs, lens = [], []
    for ao, al, bo, bl in zip(a_off, a_len, b_off, b_len):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return None
        offs.append(lo)
        lens.append(hi - lo)
    return tuple(offs), tuple(lens)


def zero1_pieces(inner: list[Piece], param_local: tuple[int, ...], layout: Layout, coords: RankCoords) -> list[Piece]:
    """Pieces of a ZeRO-1 fragment, given the parameter's ``inner`` pieces (base 0)."""
    start, stop = Zero1.partition(math.prod(param_local), layout, coords)
    out = []
    for frag_off, boffs, blens in flat_range_boxes(param_local, start, stop):
        for p in inner:
            hit = intersect_boxes(boffs, blens, p.offsets, p.lengths)
            if hit is None:
                continue
            offs, lens = hit
            rel = tuple(o - b for o, b in zip(offs, boffs))
            goff = tuple(g + o - po for g, o, po in zip(p.global_offsets, offs, p.offsets))
            out.append(Piece(frag_off, blens, rel, lens, goff))
    return out


def pattern_to_dict(p: Pattern) -> dict[str, Any]:
    """JSON form: ``{"kind": "sharded", "dim": 0}`` etc."""
    kind = {Replicated: "replicated", Sharded: "sharded", SubParams: "sub_params", Padded: "padded",
            Expert: "expert", Zero1: "zero1", Placed: "placed"}[type(p)]
    d: dict[str, Any] = {"kind": kind}
    for f in p.__dataclass_fields__:
        v = getattr(p, f)
        d[f] = list(v) if isinstance(v, tuple) else v
    return d


def pattern_from_dict(d: dict[str, Any]) -> Pattern:
    """Inverse of :func:`pattern_to_dict`."""
    classes = {"replicated": Replicated, "sharded": Sharded, "sub_params": SubParams, "padded": Padded,
               "expert": Expert, "zero1": Zero1, "placed": Placed}
    d = dict(d)
    cls = classes.get(d.pop("kind", None))
    if cls is None:
        raise LayoutError(f"unknown pattern {d!r}")
    return cls(**d)
