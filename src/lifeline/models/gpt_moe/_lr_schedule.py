"""The learning-rate schedule and global gradient-norm clipping of the reference trainer.

Both are functions of values in the checkpoint (the step, the gradients), so they need no state
of their own: a rank restored at step ``s`` computes the same learning rate as the rank that saved
it, and a stage that replays step ``s`` clips with the global norm logged at ``s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lifeline.models.gpt_moe._config import GPTMoEConfig

__all__ = ["lr_at", "local_sumsq", "clip_coefficient", "apply_clip"]


def lr_at(cfg: GPTMoEConfig, step: int) -> float:
    """Learning rate of the optimizer step taken at iteration ``step`` (0-based completed steps).

    Linear warm-up over ``cfg.warmup_steps`` steps to ``cfg.lr``, then a cosine decay to
    ``cfg.lr * cfg.min_lr_ratio`` at ``cfg.decay_steps``, constant after (the GPT-3 schedule,
    Brown et al. 2020, §B). A pure function of the step: nothing to checkpoint.
    """
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.decay_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def local_sumsq(params: Sequence[torch.nn.Parameter]) -> float:
    """Sum of squares of this rank's gradients (float64, parameters in order: deterministic)."""
    total = 0.0
    for p in params:
        total += float(p.grad.double().pow(2).sum())
    return total


def clip_coefficient(max_norm: float, sumsq: Tensor, contributors: Sequence[int]) -> float:
    """The factor every gradient is multiplied by (``<= 1``; 1 when clipping is off).

    ``sumsq`` (float64, one entry per rank of the world) holds every rank's :func:`local_sumsq`;
    the global norm sums the entries of ``contributors`` (one rank per stage: replicas hold equal
    gradients after the data-parallel all-reduce) in that order, so every rank and a later replay
    compute the same bits. As ``torch.nn.utils.clip_grad_norm_``: ``max_norm / (norm + 1e-6)``
    clamped to 1 (Pascanu et al. 2013, §3.2).
    """
    if max_norm <= 0:
        return 1.0
    total = 0.0
    for rank in contributors:
        total += float(sumsq[rank])
    return min(1.0, max_norm / (math.sqrt(total) + 1e-6))


@torch.no_grad()
def apply_clip(params: Sequence[torch.nn.Parameter], coefficient: float) -> None:
    """Scale every gradient by ``coefficient`` (nothing when it is 1)."""
    if coefficient < 1.0:
        for p in params:
            p.grad.mul_(coefficient)
