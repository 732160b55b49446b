"""Transformer layers of the GPT-MoE model: causal attention with fused QKV, SwiGLU experts, MoE.

Every module is deterministic on CPU under ``torch.use_deterministic_algorithms(True)``:
routing ties break by expert index (``torch.topk`` is stable for equal values on CPU) and
expert outputs are combined with ``index_add`` in a fixed expert order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lifeline.models.gpt_moe._config import GPTMoEConfig

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

    Parameters: ``qkv.weight`` ``(3*d_model, d_model)`` (rows: Q, K, V — the ``SubParams`` pattern)
    and ``proj.weight`` ``(d_model, d_model)``. Input/output ``(batch, seq, d_model)`` float32.
    """

    def __init__(self, cfg: GPTMoEConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rope = cfg.positions == "rope"
        if self.rope:
            cos, sin = rope_tables(cfg.seq_len, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.rope:
            cos, sin = self.cos[:t], self.sin[:t]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``.

    Parameters: ``gate_up.weight`` ``(2*hidden, d_model)`` (rows: gate, up — fused) and
    ``down.weight`` ``(d_model, hidden)``. Input ``(..., d_model)``.
    """

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.hidden, dim=-1)
        return self.down(F.silu(gate) * up)


class MoE(nn.Module):
    """A Mixture-of-Experts feed-forward layer: top-k gating over SwiGLU experts, dropless.

    Router ``router.weight`` ``(n_experts, d_model)``; experts ``experts.<i>``; optional
    always-active ``shared`` expert. For tokens ``x`` ``(n_tokens, d_model)`` the router's softmax
    probabilities ``p`` pick the top-k experts per token; their probabilities, renormalised to sum
    to one, weight the experts' outputs (GShard/Mixtral-style top-2). Every routed token is
    computed (no capacity factor, no dropped tokens).

    The load-balancing loss is Switch Transformer's (Fedus et al. 2021, §2.2, eq. 4–6),
    generalised to top-k: ``E * sum_i f_i * P_i`` with ``f_i`` the fraction of the
    ``n_tokens * k`` routing assignments that went to expert ``i`` and ``P_i`` the mean router
    probability of expert ``i``; it equals 1 under perfectly uniform routing.
    """

    def __init__(self, cfg: GPTMoEConfig) -> None:
        super().__init__()
        self.n_experts = cfg.n_experts
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, cfg.d_expert) for _ in range(cfg.n_experts))
        self.shared = SwiGLU(cfg.d_model, cfg.d_expert) if cfg.shared_expert else None
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
        counts = []
        for e, expert in enumerate(self.experts):
            token, slot = (top_i == e).nonzero(as_tuple=True)
            counts.append(token.numel())
            self.routed[e] += token.numel()
            if token.numel() == 0:
                continue
            y = expert(x.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
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

    def __init__(self, cfg: GPTMoEConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.attn = Attention(cfg)
        self.moe_norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.moe = MoE(cfg)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = x + self.attn(self.attn_norm(x))
        h, aux = self.moe(self.moe_norm(x).reshape(-1, x.shape[-1]))
        return x + h.view_as(x), aux
