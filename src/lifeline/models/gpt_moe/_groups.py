"""The process groups of one GPT-MoE rank, built from the layout's rank/coordinate mapping.

Rank order is :class:`~lifeline.checkpoint.Layout`'s: ``rank = ((pipeline*D + data)*E + expert)*T +
tensor``. A group varies some coordinates and fixes the others; every rank builds every group of a
kind in the same order (``dist.new_group`` is collective) and keeps the one it belongs to:

* ``tensor`` — varies ``tensor``: Megatron's tensor-parallel collectives (``T`` ranks);
* ``expert`` — varies ``expert``: the token all-to-all of expert parallelism (``E`` ranks);
* ``dense`` — varies ``data`` and ``expert``: gradient averaging of every parameter but the experts
  (``D*E`` ranks, replicas of the same tensor shard of the same stage, each on its own tokens);
* ``expert_data`` — varies ``data``: gradient summing of the experts (``D`` ranks holding the same
  experts); only when ``E > 1`` (with ``E = 1`` it is ``dense``).

A group of one rank is ``None`` (nothing to communicate).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lifeline.checkpoint import Layout, RankCoords

__all__ = ["Groups", "build_groups"]

_AXES = ("pipeline", "data", "expert", "tensor")


@dataclass
class Groups:
    """This rank's groups (``None`` where the group would have one rank)."""

    tensor: Any = None
    expert: Any = None
    dense: Any = None
    expert_data: Any = None


def _axis_group(layout: Layout, coords: RankCoords, vary: tuple[str, ...], timeout: timedelta | None) -> Any:
    if math.prod(getattr(layout, a) for a in vary) == 1:
        return None
    fixed = [a for a in _AXES if a not in vary]
    mine = None
    for values in itertools.product(*(range(getattr(layout, a)) for a in fixed)):
        base = dict(zip(fixed, values))
        ranks = sorted(layout.rank(RankCoords(**base, **dict(zip(vary, other))))
                       for other in itertools.product(*(range(getattr(layout, a)) for a in vary)))
        group = dist.new_group(ranks, timeout=timeout)
        if all(getattr(coords, a) == v for a, v in base.items()):
            mine = group
    return mine


def build_groups(layout: Layout, coords: RankCoords, timeout: timedelta | None = None) -> Groups:
    """Every group of ``layout`` (collective: every rank calls it, in the same order); returns the
    ones the rank at ``coords`` belongs to. ``timeout`` bounds each collective of the groups."""
    return Groups(
        tensor=_axis_group(layout, coords, ("tensor",), timeout),
        expert=_axis_group(layout, coords, ("expert",), timeout),
        dense=_axis_group(layout, coords, ("data", "expert"), timeout),
        expert_data=_axis_group(layout, coords, ("data",), timeout) if layout.expert > 1 else None,
    )
