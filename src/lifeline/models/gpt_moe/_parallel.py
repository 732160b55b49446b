"""Tensor- and expert-parallel collectives of the GPT-MoE model (gloo, CPU, deterministic).

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, §3): a column-parallel linear takes
its input through :func:`copy_to_tensor` (``f``: identity forward, sum of the input gradients
backward) and a row-parallel linear sends its partial output through :func:`reduce_from_tensor`
(``g``: sum forward, identity backward). Every sum over a group is an ``all_gather`` followed by
a sum in group-rank order, so every rank of the group holds the same bits and a run repeats
bit for bit (gloo's ``all_reduce`` makes no such promise about its reduction order).
Expert parallelism moves tokens with :func:`all_to_all` (``all_to_all_single``, whose backward
is the reverse exchange).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lifeline.errors import ConfigError

__all__ = ["ParallelContext", "group_sum", "group_max", "copy_to_tensor", "reduce_from_tensor", "all_to_all"]


@dataclass
class ParallelContext:
    """The tensor- and expert-parallel coordinates of one rank and (after ``connect``) its groups.

    ``tensor``/``tensor_rank``: degree and coordinate; ``expert``/``expert_rank`` likewise;
    ``tensor_group`` (ranks differing only in the tensor coordinate) and ``expert_group`` (ranks
    differing only in the expert coordinate) are ``torch.distributed`` process groups, ``None``
    while unconnected or when the degree is 1. Modules keep a reference and read the groups at
    call time, so a new generation's groups reach them without rebuilding the model.
    """

    tensor: int = 1
    tensor_rank: int = 0
    expert: int = 1
    expert_rank: int = 0
    tensor_group: Any = None
    expert_group: Any = None

    def require(self, kind: str) -> Any:
        """The ``kind`` (``"tensor"``/``"expert"``) group. Raises :class:`ConfigError` when unconnected."""
        group = self.tensor_group if kind == "tensor" else self.expert_group
        if group is None:
            raise ConfigError(f"{kind} degree > 1 needs the trainer's groups: call connect() after "
                              "initialising torch.distributed", field=f"layout.{kind}")
        return group


def _gather(x: Tensor, group: Any) -> list[Tensor]:
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


def group_sum(x: Tensor, group: Any) -> Tensor:
    """Sum of ``x`` over ``group`` in group-rank order (identical bits on every member); no autograd."""
    parts = _gather(x, group)
    out = parts[0].clone()
    for part in parts[1:]:
        out += part
    return out


def group_max(x: Tensor, group: Any) -> Tensor:
    """Element-wise maximum of ``x`` over ``group`` (exact); no autograd."""
    parts = _gather(x, group)
    out = parts[0].clone()
    for part in parts[1:]:
        out = torch.maximum(out, part)
    return out


class _CopyToTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return group_sum(grad, ctx.group), None


class _ReduceFromTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: Any) -> Tensor:
        return group_sum(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send: list[int], recv: list[int], group: Any) -> Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def copy_to_tensor(x: Tensor, group: Any) -> Tensor:
    """Megatron's ``f`` before a column-parallel linear: ``x`` forward, group sum of the gradients backward."""
    return x if group is None else _CopyToTensor.apply(x, group)


def reduce_from_tensor(x: Tensor, group: Any) -> Tensor:
    """Megatron's ``g`` after a row-parallel linear: group sum forward, the gradient unchanged backward."""
    return x if group is None else _ReduceFromTensor.apply(x, group)


def all_to_all(x: Tensor, send: list[int], recv: list[int], group: Any) -> Tensor:
    """Exchange rows of ``x`` ``(n, ...)``: ``send[j]`` consecutive rows go to group rank ``j``;
    returns ``(sum(recv), ...)`` with ``recv[j]`` rows from rank ``j``, in group-rank order.
    Differentiable (the backward is the reverse exchange)."""
    return _AllToAll.apply(x, list(send), list(recv), group)
