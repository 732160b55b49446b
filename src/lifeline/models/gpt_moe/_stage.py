"""One pipeline stage of the GPT-MoE model, with global (layout-independent) parameter names."""

from __future__ import annotations

import zlib

import torch
from torch import Tensor, nn

from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._layers import Block

__all__ = ["GPTMoEStage", "stage_layers"]


def stage_layers(n_layers: int, stages: int, stage: int) -> range:
    """Global indices of the layers stage ``stage`` of ``stages`` runs (balanced, earlier stages get extras)."""
    base, extra = divmod(n_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class GPTMoEStage(nn.Module):
    """Stage ``stage`` of ``stages``: the first holds the embeddings, the last the final norm and head.

    Parameter names are the same in every layout (``layers.<global index>...``), so a
    checkpoint taken with one pipeline degree loads into another. Parameters are initialised
    per tensor from a generator seeded with ``(seed, crc32(fqn))`` — identical whatever the
    layout: weights ~ N(0, init_std²), output projections scaled by ``1/sqrt(2*n_layers)``
    (GPT-2), norms at 1, padding rows of the vocabulary at 0.

    ``forward(x)``: the first stage takes token ids ``(batch, seq)`` int64, the others hidden
    states ``(batch, seq, d_model)`` float32; the last stage returns logits over the logical
    vocabulary ``(batch, seq, vocab_size)``, the others hidden states. Also returns the sum of the
    stage's MoE load-balancing losses (a scalar).
    """

    def __init__(self, cfg: GPTMoEConfig, stage: int = 0, stages: int = 1) -> None:
        super().__init__()
        self.cfg = cfg
        self.stage, self.stages = stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first:
            self.embed = nn.Embedding(cfg.padded_vocab, cfg.d_model)
            if cfg.positions == "learned":
                self.pos_embed = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in stage_layers(cfg.n_layers, stages, stage)})
        if self.last:
            self.norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
            self.lm_head = nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re)initialise every parameter deterministically from ``cfg.seed`` and its name."""
        cfg = self.cfg
        for fqn, p in self.named_parameters():
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + zlib.crc32(fqn.encode()))
            if fqn.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = cfg.init_std
            if fqn.endswith(("proj.weight", "down.weight")):
                std /= (2 * cfg.n_layers) ** 0.5
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
            if fqn in ("embed.weight", "lm_head.weight"):
                p[cfg.vocab_size:].zero_()

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        aux = torch.zeros(())
        if self.first:
            h = self.embed(x)
            if self.cfg.positions == "learned":
                h = h + self.pos_embed(torch.arange(x.shape[1]))
            x = h
        for block in self.layers.values():
            x, layer_aux = block(x)
            aux = aux + layer_aux
        if self.last:
            x = self.lm_head(self.norm(x))[..., : self.cfg.vocab_size]
        return x, aux
