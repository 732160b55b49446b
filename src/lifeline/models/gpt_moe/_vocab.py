"""Vocabulary-parallel embedding and cross entropy (Megatron-LM, Shoeybi et al. 2019, §3).

The padded vocabulary's rows are split across the tensor ranks; rank ``t`` holds rows
``[start, start + rows)``. Padding rows (``>= vocab_size``) are never looked up, and their logit
columns are cut off before the loss, so they receive no gradient and stay zero.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lifeline.models.gpt_moe._parallel import group_max, reduce_from_tensor

__all__ = ["vocab_parallel_embedding", "vocab_parallel_cross_entropy"]


def vocab_parallel_embedding(ids: Tensor, weight: Tensor, start: int, group: Any) -> Tensor:
    """Embeddings of token ``ids`` (int64, any shape) from row shards ``weight`` ``(rows, d)``.

    Each rank looks up the ids in its rows (zeros elsewhere) and the tensor group sums the
    results (forward; the gradient reaches each rank's rows unchanged). Returns float32
    ``ids.shape + (d,)``, identical on every tensor rank.
    """
    rows = weight.shape[0]
    outside = (ids < start) | (ids >= start + rows)
    local = torch.where(outside, torch.zeros_like(ids), ids - start)
    h = F.embedding(local, weight) * (~outside).unsqueeze(-1).to(weight.dtype)
    return reduce_from_tensor(h, group)


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, start: int, group: Any) -> Tensor:
    """Mean cross entropy (nats/token, scalar) of ``targets`` (int64 ``(n,)``, logical vocabulary)
    under logits split by column across the tensor group: ``logits`` float32 ``(n, cols)`` are
    columns ``[start, start + cols)`` (``cols`` may be 0 on a rank holding only padding).

    ``loss = log(sum_t sum_j exp(z_tj - m)) + m - z_target`` with ``m`` the global row maximum;
    the sums of exponentials and the target logits are summed over the group (``g``: identity
    backward), so each rank's logit gradient is its columns of ``softmax - onehot`` (over ``n``).
    """
    n, cols = logits.shape
    if cols:
        m_local = logits.detach().max(dim=-1).values
    else:
        m_local = torch.full((n,), float("-inf"), dtype=logits.dtype)
    m = group_max(m_local, group)
    sumexp = torch.exp(logits - m.unsqueeze(-1)).sum(dim=-1)
    local_t = targets - start
    inside = (local_t >= 0) & (local_t < cols)
    if cols:
        picked = logits.gather(1, local_t.clamp(0, cols - 1).unsqueeze(-1)).squeeze(-1) * inside.to(logits.dtype)
    else:
        picked = logits.sum(dim=-1)  # zeros of the right shape, attached to the graph
    total = reduce_from_tensor(torch.stack([sumexp, picked]), group)
    return (torch.log(total[0]) + m - total[1]).mean()
