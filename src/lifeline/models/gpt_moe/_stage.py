"""One pipeline stage of the GPT-MoE model, with global (layout-independent) parameter names."""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lifeline.checkpoint import Layout, Padded, RankCoords
from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._layers import Block
from lifeline.models.gpt_moe._parallel import ParallelContext, copy_to_tensor
from lifeline.models.gpt_moe._patterns import pattern_rules
from lifeline.models.gpt_moe._precision import compute_weights, torch_dtype
from lifeline.models.gpt_moe._vocab import vocab_parallel_cross_entropy, vocab_parallel_embedding

__all__ = ["GPTMoEStage", "stage_layers"]


def stage_layers(n_layers: int, stages: int, stage: int) -> range:
    """Global indices of the layers stage ``stage`` of ``stages`` runs (balanced, earlier stages get extras)."""
    base, extra = divmod(n_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class GPTMoEStage(nn.Module):
    """Stage ``stage`` of ``stages``: the first holds the embeddings, the last the final norm and head.

    Parameter names are the same in every layout (``layers.<global index>...``, experts by their
    global index), so a checkpoint taken with one layout loads into another. With ``par``
    (tensor degree ``T``, expert degree ``EP``) a rank holds its shards: the vocabulary-parallel
    embedding and output layer hold rows ``[t*V/T, (t+1)*V/T)`` of the padded vocabulary ``V``
    (Megatron-LM, Shoeybi et al. 2019, §3), attention and the shared expert as in
    :mod:`~lifeline.models.gpt_moe._layers`, experts of its expert block only.

    Parameters are initialised per tensor from a generator seeded with ``(seed, crc32(fqn))``:
    the full tensor is drawn and the rank keeps its shard (the pieces of the parameter's
    checkpoint pattern), so every layout starts from the same full parameters: weights
    ~ N(0, init_std²), output projections scaled by ``1/sqrt(2*n_layers)`` (GPT-2), norms at 1,
    padding rows of the vocabulary at 0.

    ``forward(x)``: the first stage takes token ids ``(batch, seq)`` int64, the others hidden
    states ``(batch, seq, d_model)`` float32; the last stage returns logits ``(batch, seq,
    vocab_size)`` over the logical vocabulary (with ``T > 1``: this rank's columns of it, see
    :meth:`loss`), the others hidden states. Also returns the sum of the stage's MoE
    load-balancing losses (a scalar).
    """

    def __init__(self, cfg: GPTMoEConfig, stage: int = 0, stages: int = 1, par: ParallelContext | None = None
                 ) -> None:
        super().__init__()
        self.cfg = cfg
        self.par = par or ParallelContext()
        self.stage, self.stages = stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        rows = cfg.padded_vocab // self.par.tensor
        self.vocab_start = self.par.tensor_rank * rows
        """First padded-vocabulary row (and logit column) this rank holds."""
        self.vocab_local = max(0, min(rows, cfg.vocab_size - self.vocab_start))
        """Logical-vocabulary columns this rank's logits hold (its rows minus padding)."""
        if self.first:
            self.embed = nn.Embedding(rows, cfg.d_model)
            if cfg.positions == "learned":
                self.pos_embed = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): Block(cfg, self.par) for i in stage_layers(cfg.n_layers, stages, stage)})
        if self.last:
            self.norm = nn.RMSNorm(cfg.d_model, eps=1e-5)
            self.lm_head = nn.Linear(cfg.d_model, rows, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re)initialise every parameter deterministically from ``cfg.seed`` and its name."""
        cfg, rules = self.cfg, pattern_rules(self.cfg)
        layout = Layout(tensor=self.par.tensor, expert=self.par.expert)
        coords = RankCoords(tensor=self.par.tensor_rank, expert=self.par.expert_rank)
        for fqn, p in self.named_parameters():
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + zlib.crc32(fqn.encode()))
            if fqn.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = cfg.init_std
            if fqn.endswith(("proj.weight", "down.weight")):
                std /= (2 * cfg.n_layers) ** 0.5
            pattern = rules.match(fqn)
            local = tuple(p.shape)
            padded = isinstance(pattern, Padded)
            full_shape = (cfg.padded_vocab,) + local[1:] if padded else pattern.global_shape(local, layout)
            full = torch.randn(full_shape, generator=gen, dtype=p.dtype) * std
            if padded:
                full[cfg.vocab_size:].zero_()
            if full_shape == local:
                p.copy_(full)
                continue
            p.zero_()  # padding rows: in no piece, zero
            for piece in pattern.pieces(local, layout, coords):
                dst = p.view(piece.base_shape)[tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.lengths))]
                dst.copy_(full[tuple(slice(g, g + n) for g, n in zip(piece.global_offsets, piece.lengths))])

    def _group(self):
        return self.par.require("tensor") if self.par.tensor > 1 else None

    def forward(self, x: Tensor, *, rounded: bool = False) -> tuple[Tensor, Tensor]:
        """``x``: token ids ``(batch, seq)`` int64 on the first stage, else hidden states ``(batch, seq,
        d_model)`` float32 → (hidden states, or the last stage's logits, float32; the stage's
        load-balancing loss, a float32 scalar). With ``cfg.compute_dtype`` other than float32 every
        parameter enters as its rounding to that dtype (:mod:`~lifeline.models.gpt_moe._precision`);
        ``rounded`` marks the call that already has them."""
        dtype = torch_dtype(self.cfg.compute_dtype)
        if dtype != torch.float32 and not rounded:
            return functional_call(self, compute_weights(self, dtype), (x,), {"rounded": True})
        aux = torch.zeros(())
        group = self._group()
        if self.first:
            h = self.embed(x) if group is None else vocab_parallel_embedding(x, self.embed.weight, self.vocab_start,
                                                                               group)
            if self.cfg.positions == "learned":
                h = h + self.pos_embed(torch.arange(x.shape[1]))
            x = h
        for block in self.layers.values():
            x, layer_aux = block(x)
            aux = aux + layer_aux
        if self.last:
            x = self.lm_head(copy_to_tensor(self.norm(x), group))[..., : self.vocab_local if group is not None
                                                                   else self.cfg.vocab_size]
        return x, aux

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross entropy (nats/token, scalar) of the last stage's ``logits`` against ``targets``
        ``(batch, seq)`` int64; with ``T > 1`` the vocabulary-parallel cross entropy over the
        tensor group (the same value, and the same bits, on every tensor rank)."""
        group = self._group()
        if group is None:
            return F.cross_entropy(logits.reshape(-1, self.cfg.vocab_size), targets.reshape(-1))
        return vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                            self.vocab_start, group)
