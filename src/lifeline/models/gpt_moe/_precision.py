"""Mixed-precision compute weights: fp32 master parameters, each used rounded to the compute dtype.

With ``compute_dtype: bfloat16`` every parameter of a stage enters the forward pass as its
bfloat16 rounding (round to nearest even), as in Megatron-LM's and FSDP2's mixed precision
(Micikevicius et al. 2018, "Mixed Precision Training", §3.1: an fp32 master copy updated by the
optimizer, a half-precision copy used by forward and backward). The optimizer (AdamW) still
updates the fp32 masters with fp32 gradients.

This is what makes MoEvement's FROZEN copies exact (Gandhi et al., arXiv 2412.15411, §4): a FROZEN
operator is replayed with its compute weights only, and here those are 2 bytes per parameter
whose fp32 widening (exact) rounds back to the same bfloat16 values. On CPU the activations,
reductions and collectives stay fp32 (bfloat16 matmuls are emulated on most x86 CPUs and gloo
lacks bfloat16 for some collectives): the compute weights are bfloat16, the arithmetic fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["compute_weights", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the names of _config.COMPUTE_DTYPES


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``compute_dtype`` name (``"float32"`` or ``"bfloat16"``).

    Raises:
        KeyError: another name (:meth:`GPTMoEConfig.validate` refuses it first, naming the field).
    """
    return _DTYPES[name]


class _Rounded(torch.autograd.Function):
    """``w`` rounded to ``dtype`` and widened back to ``w.dtype``; the gradient passes unchanged
    (the gradient with respect to the compute weight is the master's, accumulated in fp32)."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, dtype: torch.dtype) -> Tensor:  # noqa: D102
        return w.to(dtype).to(w.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # noqa: D102
        return grad, None


def compute_weights(module: nn.Module, dtype: torch.dtype) -> dict[str, Tensor]:
    """Every parameter of ``module`` (by its name) as the forward pass uses it: rounded to ``dtype``
    and widened back (same shape and dtype as the parameter; a differentiable view of it for
    autograd). Pass the result to :func:`torch.func.functional_call`."""
    return {name: _Rounded.apply(p, dtype) for name, p in module.named_parameters()}
