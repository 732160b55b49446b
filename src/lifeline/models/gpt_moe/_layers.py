"""Transformer layers of the GPT-MoE model: causal attention with fused QKV, SwiGLU experts, MoE.

Every module is deterministic on CPU under ``torch.use_deterministic_algorithms(True)``:
routing ties break by expert index (``torch.topk`` is stable for equal values on CPU) and
expert outputs are combined with ``index_add`` in a fixed expert order.

With a :class:`~lifeline.models.gpt_moe._parallel.ParallelContext` of tensor degree ``T`` the
attention and the shared expert are Megatron-parallel (Shoeybi et al. 2019, §3): each rank holds
``n_heads / T`` heads (its slice of Q, K and V: the ``SubParams`` layout) and ``1 / T`` of the
shared expert's gate and up rows, and the output projections are row-parallel (``Sharded(1)``);
the router, the norms and the routed experts are replicated across tensor ranks. With expert
degree ``EP`` a rank holds experts ``[e * E/EP, (e+1) * E/EP)`` (the ``Expert`` pattern) and
tokens reach them through :func:`~lifeline.models.gpt_moe._dispatch.expert_parallel`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._dispatch import expert_parallel
from lifeline.models.gpt_moe._parallel import ParallelContext, copy_to_tensor, reduce_from_tensor

__all__ = ["Attention", "SwiGLU", "MoE", "Block", "rope_tables"]


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """Rotary position tables (Su et al. 2021, RoFormer §3.4.2), float32 ``(seq_len, head_dim)`` each."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection.

    Parameters: ``qkv.weight`` ``(3*d_model/T, d_model)`` (rows: this rank's Q, K, V heads — the
    ``SubParams`` pattern) and ``proj.weight`` ``(d_model, d_model/T)`` (row-parallel). Input/output
    ``(batch, seq, d_model)`` float32, whole on every tensor rank.
    """

    def __init__(self, cfg: GPTMoEConfig, par: ParallelContext | None = None) -> None:
        super().__init__()
        self.par = par or ParallelContext()
        self.n_heads = cfg.n_heads // self.par.tensor
        self.head_dim = cfg.d_model // cfg.n_heads
        local = self.n_heads * self.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * local, bias=False)
        self.proj = nn.Linear(local, cfg.d_model, bias=False)
        self.rope = cfg.positions == "rope"
        if self.rope:
            cos, sin = rope_tables(cfg.seq_len, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        group = self.par.require("tensor") if self.par.tensor > 1 else None
        q, k, v = self.qkv(copy_to_tensor(x, group)).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.rope:
            cos, sin = self.cos[:t], self.sin[:t]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return reduce_from_tensor(self.proj(y.transpose(1, 2).reshape(b, t, -1)), group)


class SwiGLU(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``.

    Parameters: ``gate_up.weight`` ``(2*hidden/T, d_model)`` (rows: this rank's gate rows, then
    its up rows — the ``SubParams`` pattern) and ``down.weight`` ``(d_model, hidden/T)``
    (row-parallel). ``par`` given: tensor-parallel over its tensor group (the shared expert);
    ``None``: whole (the routed experts). Input ``(..., d_model)``.
    """

    def __init__(self, d_model: int, hidden: int, par: ParallelContext | None = None) -> None:
        super().__init__()
        self.par = par
        self.hidden = hidden // (par.tensor if par is not None else 1)
        self.gate_up = nn.Linear(d_model, 2 * self.hidden, bias=False)
        self.down = nn.Linear(self.hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        group = self.par.require("tensor") if self.par is not None and self.par.tensor > 1 else None
        gate, up = self.gate_up(copy_to_tensor(x, group)).split(self.hidden, dim=-1)
        return reduce_from_tensor(self.down(F.silu(gate) * up), group)


class MoE(nn.Module):
    """A Mixture-of-Experts feed-forward layer: top-k gating over SwiGLU experts, dropless.

    Router ``router.weight`` ``(n_experts, d_model)``; experts ``experts.<i>`` (``i`` the global
    expert index; with expert degree ``EP`` only this rank's block of ``n_experts / EP``);
    optional always-active ``shared`` expert (tensor-parallel). For tokens ``x``
    ``(n_tokens, d_model)`` the router's softmax probabilities ``p`` pick the top-k experts per
    token; their probabilities, renormalised to sum to one, weight the experts' outputs
    (GShard/Mixtral-style top-2). Every routed token is computed (no capacity factor, no dropped
    tokens), on this rank or, with ``EP > 1``, on the rank that owns its expert.

    The load-balancing loss is Switch Transformer's (Fedus et al. 2021, §2.2, eq. 4–6),
    generalised to top-k: ``E * sum_i f_i * P_i`` with ``f_i`` the fraction of the
    ``n_tokens * k`` routing assignments that went to expert ``i`` and ``P_i`` the mean router
    probability of expert ``i``; it equals 1 under perfectly uniform routing. It is computed on
    this rank's tokens.
    """

    def __init__(self, cfg: GPTMoEConfig, par: ParallelContext | None = None) -> None:
        super().__init__()
        self.par = par or ParallelContext()
        self.n_experts = cfg.n_experts
        self.top_k = cfg.top_k
        per = cfg.n_experts // self.par.expert
        self.owned = range(self.par.expert_rank * per, (self.par.expert_rank + 1) * per)
        """Global indices of the experts this rank holds (a contiguous block, the ``Expert`` pattern)."""
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): SwiGLU(cfg.d_model, cfg.d_expert) for e in self.owned})
        self.shared = SwiGLU(cfg.d_model, cfg.d_expert, self.par) if cfg.shared_expert else None
        self.routed = torch.zeros(cfg.n_experts, dtype=torch.int64)
        """Routing assignments per expert (global expert index) since the last :meth:`reset_routed`:
        int64 ``(n_experts,)``, counted on this rank's tokens. MoEvement's activation counts."""

    def reset_routed(self) -> None:
        """Zero :attr:`routed` (the trainer calls it at the start of every step)."""
        self.routed.zero_()

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` ``(n_tokens, d_model)`` → (output ``(n_tokens, d_model)``, scalar load-balancing loss)."""
        probs = torch.softmax(self.router(x), dim=-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True)
        out = self.shared(x) if self.shared is not None else torch.zeros_like(x)
        picks = [(top_i == e).nonzero(as_tuple=True) for e in range(self.n_experts)]
        counts = [token.numel() for token, _ in picks]
        self.routed += torch.tensor(counts, dtype=torch.int64)
        if self.par.expert > 1:
            token = torch.cat([t for t, _ in picks])
            slot = torch.cat([s for _, s in picks])
            y = expert_parallel(x.index_select(0, token), counts, self.experts, self.owned,
                                self.par.require("expert"), self.par.expert)
            out = out.index_add(0, token, y * weights[token, slot].unsqueeze(-1))
        else:
            for e, (token, slot) in enumerate(picks):
                if token.numel() == 0:
                    continue
                y = self.experts[str(e)](x.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
                out = out.index_add(0, token, y)
        fraction = torch.tensor(counts, dtype=probs.dtype) / float(x.shape[0] * self.top_k)
        aux = self.n_experts * torch.sum(fraction * probs.mean(dim=0))
        return out, aux


class Block(nn.Module):
    """A pre-norm decoder block: ``x + attn(norm(x))`` then ``x + moe(norm(x))``.

    Parameters: ``attn_norm.weight``, ``attn.*``, ``moe_norm.weight``, ``moe.*`` (RMSNorm, Zhang &
    Sennrich 2019). ``forward`` returns the output ``(batch, seq, d_model)`` and the layer's
    load-balancing loss.
    """

    def __init__(self, cfg: GPTMoEConfig, par: ParallelContext | None = None) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.attn = Attention(cfg, par)
        self.moe_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.moe = MoE(cfg, par)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = x + self.attn(self.attn_norm(x))
        h, aux = self.moe(self.moe_norm(x).reshape(-1, x.shape[-1]))
        return x + h.view_as(x), aux
