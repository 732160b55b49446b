"""Expert-parallel token dispatch and combine (dropless, fixed order, deterministic).

After GShard (Lepikhin et al. 2021, §2.2) and Megatron-LM's MoE token dispatcher: every rank of an
expert-parallel group routes its own tokens, sends each routed token to the rank owning its
expert with one ``all_to_all_single``, the owners run their experts, and a second
``all_to_all_single`` returns the outputs to where the tokens came from. No capacity factor:
split sizes are the exact routing counts, exchanged first with an ``all_gather``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lifeline.models.gpt_moe._parallel import all_to_all

__all__ = ["expert_parallel"]


def expert_parallel(rows: Tensor, counts: Sequence[int], experts: nn.ModuleDict, owned: range, group: Any,
                    degree: int) -> Tensor:
    """The expert outputs of this rank's routed token copies, computed on the experts' owners.

    Args:
        rows: float32 ``(n, d_model)``: this rank's routing assignments sorted by global expert
            index (``counts[e]`` consecutive rows for expert ``e``), token order within an expert.
        counts: assignments per global expert on this rank (length ``n_experts``, sums to ``n``).
        experts: this rank's experts, keyed by global index (``str``); ``owned`` their indices.
        group: the expert-parallel process group (``degree`` ranks; group rank ``j`` owns experts
            ``[j * n_experts/degree, (j+1) * n_experts/degree)``).

    Returns:
        float32 ``(n, d_model)``: row ``i`` is the output of its expert for ``rows[i]``
        (differentiable: gradients return to the sending ranks through the reverse exchange).

    The order is fixed: a rank receives from group rank 0 first, and an expert's input is its rows
    from every sender in sender order, so every run computes the same bits.
    """
    n_experts = len(counts)
    per = n_experts // degree
    local = torch.tensor(list(counts), dtype=torch.int64)
    parts = [torch.empty_like(local) for _ in range(degree)]
    dist.all_gather(parts, local, group=group)
    matrix = torch.stack(parts)  # (sender, global expert): assignments
    me = owned.start // per
    send = [int(matrix[me, j * per:(j + 1) * per].sum()) for j in range(degree)]
    recv = [int(matrix[src, owned.start:owned.stop].sum()) for src in range(degree)]
    got = all_to_all(rows, send, recv, group)
    # got: sender-major, expert-minor blocks; gather each expert's rows over senders, in sender order
    sizes = [int(matrix[src, e]) for src in range(degree) for e in owned]
    blocks = list(got.split(sizes))
    outputs: list[Tensor] = list(blocks)  # an expert that received nothing returns its empty blocks
    for k, e in enumerate(owned):
        idx = [src * len(owned) + k for src in range(degree)]
        inputs = torch.cat([blocks[i] for i in idx])
        if inputs.shape[0] == 0:
            continue
        out = experts[str(e)](inputs)
        for i, piece in zip(idx, out.split([sizes[i] for i in idx])):
            outputs[i] = piece
    return all_to_all(torch.cat(outputs), recv, send, group)
