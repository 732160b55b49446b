"""ZeRO-1: AdamW whose moments each data-parallel rank keeps for its partition of every parameter only.

Rajbhandari et al. 2020 (ZeRO), §5.1 stage ``P_os``: the optimizer state is partitioned across the
``D`` data-parallel ranks; each rank updates its partition of the parameters with its partition of
the state, then the updated partitions are all-gathered so every replica holds the whole parameters
again. Partitions are per parameter, the :class:`~lifeline.checkpoint.Zero1` pattern's: the
parameter (this rank's tensor-parallel local tensor), flattened, is cut into ``D`` pieces of
``ceil(numel / D)`` elements and data rank ``d`` owns piece ``d`` (the last may be shorter or empty).

AdamW is elementwise, so updating a partition with that partition's moments gives the bits the
whole-tensor update gives (``foreach=False``; the gradients are the same full, already averaged and
clipped ones: the gradient reduction is unchanged, this saves memory, not communication).

Expert-parallel ranks of the same data coordinate hold the same partition of a dense parameter
(the pattern partitions over ``data`` only) and compute the same update from the same gradients.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lifeline.checkpoint import Layout, RankCoords, Zero1
from lifeline.errors import ConfigError

__all__ = ["Zero1AdamW"]


class Zero1AdamW:
    """AdamW over this data rank's partitions of ``params`` (``(fqn, parameter)`` pairs, float32, CPU).

    ``optimizer`` is a :class:`torch.optim.AdamW` whose parameters are 1-D views of the model's
    parameters (:attr:`shards`, the partition ``[start, stop)`` of each flattened parameter): its
    in-place update writes the model parameters' partitions directly. :meth:`step` points each
    view's gradient at the same partition of the full gradient, steps, and all-gathers the
    partitions over ``group`` (the ranks that differ only in the data coordinate).
    """

    def __init__(self, params: list[tuple[str, torch.nn.Parameter]], layout: Layout, coords: RankCoords,
                 **adamw: Any) -> None:
        self.params = [p for _, p in params]
        self.data, self.data_rank = layout.data, coords.data
        self.ranges = [Zero1.partition(p.numel(), layout, coords) for p in self.params]
        self.sizes = [-(-p.numel() // layout.data) for p in self.params]
        self.shards: dict[str, torch.nn.Parameter] = {
            fqn: torch.nn.Parameter(p.detach().view(-1)[start:stop])
            for (fqn, p), (start, stop) in zip(params, self.ranges)}
        self.optimizer = torch.optim.AdamW(list(self.shards.values()), foreach=False, **adamw)
        self.group: Any = None

    @property
    def param_groups(self) -> list[dict]:
        """The AdamW parameter groups (the trainer sets each step's ``lr`` there)."""
        return self.optimizer.param_groups

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's partitions, then all-gather every parameter over :attr:`group` (one
        flat float32 buffer of ``sum(ceil(numel / D))`` elements per rank, partitions zero-padded).

        Raises:
            ConfigError: ``data > 1`` and no group (the trainer was never connected).
        """
        for p, shard, (start, stop) in zip(self.params, self.shards.values(), self.ranges):
            shard.grad = p.grad.view(-1)[start:stop]
        self.optimizer.step()
        if self.data == 1:
            return
        if self.group is None:
            raise ConfigError("zero1 with layout data > 1 needs the data-parallel group: call the trainer's "
                              "connect() after initialising torch.distributed", field="zero1")
        mine = torch.zeros(sum(self.sizes))
        offset = 0
        for p, (start, stop), size in zip(self.params, self.ranges, self.sizes):
            mine[offset: offset + stop - start] = p.view(-1)[start:stop]
            offset += size
        parts = [torch.empty_like(mine) for _ in range(self.data)]
        dist.all_gather(parts, mine, group=self.group)
        for d, part in enumerate(parts):
            if d == self.data_rank:
                continue
            offset = 0
            for p, size in zip(self.params, self.sizes):
                start = min(p.numel(), d * size)
                stop = min(p.numel(), start + size)
                p.view(-1)[start:stop] = part[offset: offset + stop - start]
                offset += size

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the full gradients of every parameter (the views' gradients are partitions of them)."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @property
    def state(self) -> dict[Tensor, dict[str, Tensor]]:
        """AdamW's state, keyed by the partition views (:attr:`shards`)."""
        return self.optimizer.state

    def numel(self) -> int:
        """Elements of this rank's partitions (each moment holds this many; ``sum(ceil(n/D))`` at most)."""
        return sum(stop - start for start, stop in self.ranges)
