"""Cut a consolidated (full) state into one rank's local state: the inverse of consolidation."""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._patterns import Expert, Zero1
from lifeline.checkpoint._shard_plan import local_pieces
from lifeline.checkpoint._rules import PatternRules

__all__ = ["shard_state", "local_shape"]


def local_shape(fqn: str, global_shape: tuple[int, ...], layout: Layout, rank: int, rules: PatternRules,
                param_shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The local shape rank ``rank`` of ``layout`` holds of tensor ``fqn`` (global shape ``global_shape``).

    ZeRO-1 entries need their parameter's local shape in ``param_shapes``. Raises
    :class:`LayoutError` when the layout cannot take the tensor (a degree not dividing a dim).
    """
    coords = layout.coords(rank)
    pattern = rules.match(fqn)
    if isinstance(pattern, Zero1):
        start, stop = Zero1.partition(math.prod((param_shapes or {})[pattern.param]), layout, coords)
        return (stop - start,)
    return tuple(pattern.local_shape(tuple(global_shape), layout, coords))


def shard_state(full: Mapping[str, Any], layout: Layout, rank: int, rules: PatternRules) -> dict[str, Any]:
    """Rank ``rank``'s local state of ``layout`` cut from the full state ``full``.

    Experts the rank does not own (``Expert.num_experts`` given) are left out; padding rows
    of :class:`Padded` tensors are zero; byte entries are copied as they are.
    """
    layout.validate()
    coords = layout.coords(rank)
    out: dict[str, Any] = {}
    zero = []
    for fqn, value in full.items():
        if not isinstance(value, torch.Tensor):
            out[fqn] = value
            continue
        pattern = rules.match(fqn)
        if isinstance(pattern, Zero1):
            zero.append(fqn)
            continue
        if isinstance(pattern, Expert) and pattern.owner(layout) not in (None, coords.expert):
            continue
        out[fqn] = torch.zeros(local_shape(fqn, tuple(value.shape), layout, rank, rules), dtype=value.dtype)
    for fqn in zero:
        param = rules.match(fqn).param
        if param not in out:
            continue
        out[fqn] = torch.zeros(local_shape(fqn, (), layout, rank, rules, {param: tuple(out[param].shape)}),
                               dtype=full[fqn].dtype)
    shapes = {k: tuple(v.shape) for k, v in out.items() if isinstance(v, torch.Tensor)}
    for fqn, local in out.items():
        if not isinstance(local, torch.Tensor):
            continue
        _, pieces = local_pieces(fqn, rules.match(fqn), shapes[fqn], shapes, layout, coords, rules)
        flat = local.view(-1)
        src = full[fqn]
        for p in pieces:
            base = flat[p.base : p.base + math.prod(p.base_shape)].view(p.base_shape)
            dst = base[tuple(slice(o, o + n) for o, n in zip(p.offsets, p.lengths))]
            dst.copy_(src[tuple(slice(o, o + n) for o, n in zip(p.global_offsets, p.lengths))])
    return out

