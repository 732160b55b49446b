"""DTensor entries of a ``Stateful`` state: their local shard, their ``placed`` pattern, and back.

``torch.distributed.checkpoint.state_dict.get_state_dict`` of an FSDP2 (``fully_shard``) or
tensor-parallel model returns ``DTensor`` values. :class:`StatefulState` stores each as its local
shard (a plain CPU tensor of the rank's blob) under the pattern :class:`~lifeline.checkpoint.Placed`
(global shape + placements, mesh dimensions named by layout axes), held in :class:`StateRules` so the
checkpointer plans, seals and reshards it like any other pattern; a load wraps the restored shard
in a DTensor on the *live* mesh and placements (the ones the state has now, after an elastic
reshard the new world's).

Mesh dimensions map to layout axes by name (``data``/``dp``/``fsdp``/``dp_shard`` → data,
``tensor``/``tp`` → tensor, ``pipeline``/``pp``, ``expert``/``ep``); an unnamed one-dimensional
mesh is the data axis (``fully_shard`` without a mesh). The mesh must span the job's ranks in the
layout's rank order (tensor fastest, then data), which is how ``init_device_mesh`` numbers them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from lifeline.checkpoint import Layout, Pattern, PatternRules, Placed, RankCoords
from lifeline.errors import CheckpointError, ConfigError

__all__ = ["LiveShard", "StateRules", "live_shard", "rebuild"]

_ALIASES = {"data": "data", "dp": "data", "fsdp": "data", "dp_shard": "data", "tensor": "tensor", "tp": "tensor",
            "pipeline": "pipeline", "pp": "pipeline", "expert": "expert", "ep": "expert"}


class StateRules(PatternRules):
    """The checkpointer's pattern rules for a state with DTensor entries: the ``placed`` pattern of each
    DTensor entry (exact name, refreshed whenever the state is taken), else the ``base`` rules.

    Args:
        base: the rules of the plain tensors (default all replicated: data parallelism).
    """

    def __init__(self, base: PatternRules | None = None) -> None:
        base = base if base is not None else PatternRules()
        super().__init__((), default=base.default)
        self.base = base
        self.placed: dict[str, Placed] = {}

    def match(self, fqn: str) -> Pattern:
        """The ``placed`` pattern of DTensor entry ``fqn``, else the base rules' match.

        Raises:
            LayoutError: no base rule matches and the base has no default.
        """
        placed = self.placed.get(fqn)
        return placed if placed is not None else self.base.match(fqn)

    def __repr__(self) -> str:
        return f"StateRules(placed={sorted(self.placed)!r}, base={self.base!r})"


@dataclass(frozen=True)
class LiveShard:
    """What a DTensor entry is now: ``pattern`` (global shape, placements), the ``mesh`` and
    ``placements`` to wrap a restored shard in, the local ``shape``/``device`` it must have and the
    global ``stride``."""

    pattern: Placed
    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    device: torch.device
    stride: tuple[int, ...]


_checked_meshes: dict[tuple, tuple[str, ...]] = {}  # (dim names, rank grid) -> axes


def _axes(mesh: Any, path: str) -> tuple[str, ...]:
    """The layout axis of each dimension of ``mesh``, its rank grid checked against the layout's order."""
    key = (mesh.mesh_dim_names, tuple(mesh.mesh.shape), tuple(mesh.mesh.reshape(-1).tolist()))
    cached = _checked_meshes.get(key)
    if cached is not None:
        return cached
    names = mesh.mesh_dim_names
    if names is None:
        if mesh.ndim != 1:
            raise ConfigError(f"DTensor entry {path!r} lies on an unnamed {mesh.ndim}-D device mesh: name its "
                              f"dimensions (init_device_mesh(..., mesh_dim_names=('data', 'tensor')))", key=path)
        names = ("data",)
    axes = []
    for name in names:
        axis = _ALIASES.get(name)
        if axis is None or axis in axes:
            raise ConfigError(f"DTensor entry {path!r}: mesh dimension {name!r} names no layout axis (use one of "
                              f"{sorted(_ALIASES)}, each axis once)", key=path)
        axes.append(axis)
    sizes = dict(zip(axes, mesh.mesh.shape))
    grid = Layout(**sizes)
    expected = [grid.rank(RankCoords(**dict(zip(axes, c)))) for c in _coords(tuple(mesh.mesh.shape))]
    if mesh.mesh.reshape(-1).tolist() != expected:
        raise ConfigError(f"DTensor entry {path!r}: device mesh {mesh.mesh.tolist()} (dims {list(names)}) does not "
                          f"number the ranks as the layout does (tensor fastest, then expert, data, pipeline)",
                          key=path)
    _checked_meshes[key] = tuple(axes)
    return tuple(axes)


def _coords(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every index of ``shape`` in C order."""
    out = []
    for flat in range(math.prod(shape)):
        idx = []
        for n in reversed(shape):
            idx.append(flat % n)
            flat //= n
        out.append(tuple(reversed(idx)))
    return out


def live_shard(value: DTensor, path: str) -> LiveShard:
    """The :class:`LiveShard` of DTensor ``value`` (entry ``path``).

    Raises:
        ConfigError: a placement other than ``Shard``/``Replicate`` (``Partial``, strided shards of a
            flattened mesh), or a mesh whose dimensions map to no layout axis.
    """
    axes = _axes(value.device_mesh, path)
    shards: list[int | None] = []
    for placement in value.placements:
        if type(placement) is Shard:
            shards.append(placement.dim)
        elif type(placement) is Replicate:
            shards.append(None)
        else:
            raise ConfigError(f"DTensor entry {path!r} has placement {placement}: only Shard(dim) and Replicate() "
                              "are checkpointed (reduce a Partial first)", key=path)
    local = value.to_local()
    return LiveShard(Placed(tuple(value.shape), axes, tuple(shards)), value.device_mesh, tuple(value.placements),
                     tuple(local.shape), local.device, tuple(value.stride()))


def rebuild(local: Tensor, live: LiveShard, path: str) -> DTensor:
    """Wrap restored shard ``local`` (this rank's box, any device) as a DTensor on ``live``'s mesh.

    Raises:
        CheckpointError: ``local`` is not the live shard's shape (a state taken in another layout).
    """
    if tuple(local.shape) != live.shape:
        raise CheckpointError(f"entry {path!r}: shard of shape {list(local.shape)} does not fit the live shard "
                              f"{list(live.shape)} (a state taken in another layout; restore a checkpoint instead)",
                              key=path)
    if local.device != live.device:
        local = local.to(live.device)
    return DTensor.from_local(local, live.mesh, live.placements, run_check=False, shape=torch.Size(live.pattern.shape),
                              stride=live.stride)
