"""The GPT-MoE model's universal-checkpoint patterns, declared once as a table of name rules."""

from __future__ import annotations

from lifeline.checkpoint import Expert, Padded, PatternRules, Replicated, Sharded, SubParams, Zero1
from lifeline.models.gpt_moe._config import GPTMoEConfig

__all__ = ["pattern_rules", "OPTIM_KEYS"]

OPTIM_KEYS = ("exp_avg", "exp_avg_sq")
"""AdamW moments stored as ``optim.<key>.<param fqn>``, shaped and laid out like the parameter."""

_OPT = r"(?:optim\.(?:exp_avg|exp_avg_sq)\.)?"  # a moment has its parameter's pattern


def pattern_rules(cfg: GPTMoEConfig) -> PatternRules:
    """Patterns of every tensor in :func:`~lifeline.models.gpt_moe.state` (first match wins).

    Written as if tensor parallelism could be > 1 (Megatron layouts): fused QKV and the shared
    expert's fused gate/up are ``SubParams`` (each part split across tensor ranks), attention and
    SwiGLU output projections are row-parallel ``Sharded(1)``, vocabularies are ``Padded`` (padding
    rows never stored), experts are ``Expert(layer, index)`` (whole, owned by one expert rank),
    norms, router and learned positions are ``Replicated``. The per-parameter AdamW ``step`` is a
    replicated scalar. With ``cfg.zero1`` the moments are ``Zero1(<param fqn>)`` instead: data rank
    ``d`` stores partition ``d`` of the flattened (tensor-parallel local) moment, 1-D.
    There is no default: a tensor without a rule is a ``LayoutError``.
    """
    d, h, v = cfg.d_model, cfg.d_expert, cfg.vocab_size
    zero1 = [("re:optim\\.(?:exp_avg|exp_avg_sq)\\.(.+)", Zero1(r"\1"))] if cfg.zero1 else []
    return PatternRules(
        zero1 + [
            (f"re:{_OPT}embed\\.weight", Padded(0, v)),
            (f"re:{_OPT}lm_head\\.weight", Padded(0, v)),
            (f"re:{_OPT}pos_embed\\.weight", Replicated()),
            (f"re:{_OPT}layers\\.\\d+\\.attn\\.qkv\\.weight", SubParams(0, (d, d, d))),
            (f"re:{_OPT}layers\\.\\d+\\.attn\\.proj\\.weight", Sharded(1)),
            (f"re:{_OPT}layers\\.(?P<layer>\\d+)\\.moe\\.experts\\.(?P<index>\\d+)\\.(?:gate_up|down)\\.weight",
             Expert(num_experts=cfg.n_experts)),
            (f"re:{_OPT}layers\\.\\d+\\.moe\\.shared\\.gate_up\\.weight", SubParams(0, (h, h))),
            (f"re:{_OPT}layers\\.\\d+\\.moe\\.shared\\.down\\.weight", Sharded(1)),
            (f"re:{_OPT}layers\\.\\d+\\.moe\\.router\\.weight", Replicated()),
            (f"re:{_OPT}(?:layers\\.\\d+\\.(?:attn_norm|moe_norm)|norm)\\.weight", Replicated()),
            ("re:optim\\.step\\..+", Replicated()),
        ],
        default=None,
    )
