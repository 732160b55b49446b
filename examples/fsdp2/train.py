"""A PyTorch FSDP2 (``fully_shard``) training script under Lifeline, elastic (docs/sdk.md "FSDP2").

A tiny Llama-style byte model — RMSNorm, causal attention with rotary embeddings, SwiGLU MLP — trained with AdamW on the source of the standard library's ``json`` package, every
block and the whole model ``fully_shard``-ed over the job's ranks (gloo on CPU). The checkpointed
state is the DCP recipe's: ``get_state_dict(model, optim)`` (DTensor shards) behind a ``Stateful``;
Lifeline stores each DTensor's shard with its global shape and placements, so a job started at
world size 4 that loses nodes restores at 2 from the surviving sidecars' memory, resharded.

The global batch (``GLOBAL_BATCH`` sequences of step ``s``, a function of (seed, step) only) is the
same at every world size; each rank takes its ``GLOBAL_BATCH / world_size`` of it. The process group
of each generation is new, so ``connect`` rebuilds the sharded model on it and the runtime restores
into it (``disconnect`` drops the old one).
"""

from __future__ import annotations

import json
import pathlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import lifeline.runtime as lifeline

SEQ, GLOBAL_BATCH, VOCAB = 16, 12, 256  # bytes per sequence, sequences per step (4, 3, 2 ranks divide it)


class Block(nn.Module):
    """Pre-norm Llama block: x + attn(norm(x)), then + SwiGLU(norm(x))."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, t, d = x.shape  # [batch, SEQ, dim]
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        q, k = _rotate(q, rope), _rotate(k, rope)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary embedding of ``x`` [batch, heads, SEQ, head_dim] (halves rotated)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TinyLlama(nn.Module):
    """Bytes [batch, SEQ] int64 -> next-byte logits [batch, SEQ, VOCAB]."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, VOCAB, bias=False)
        half = dim // heads // 2
        freqs = torch.outer(torch.arange(SEQ, dtype=torch.float32), 10000.0 ** (-torch.arange(half) / half))
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, (self.cos, self.sin))
        return self.head(self.norm(h))


def build(seed: int) -> tuple[TinyLlama, torch.optim.Optimizer]:
    """The model, seeded, each block and the whole ``fully_shard``-ed over the current process group,
    and its AdamW with its moments in place: ``get_state_dict`` creates them on a fresh optimizer (one
    zero-gradient step at learning rate 0, counted in AdamW's ``step``), so it is called here, once,
    rather than whenever the first state is taken (``train()`` takes one at start)."""
    torch.manual_seed(seed)
    model = TinyLlama()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    get_state_dict(model, optim)
    return model, optim


def corpus() -> torch.Tensor:
    """The bytes of ``json/__init__.py`` (ships with Python) as an int64 tensor."""
    return torch.tensor(list(pathlib.Path(json.__file__).read_bytes()), dtype=torch.long)


def batch(data: torch.Tensor, step: int, rank: int, world_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of global batch ``step`` (inputs, next bytes), each [GLOBAL_BATCH / world_size, SEQ]."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - SEQ - 1, (GLOBAL_BATCH,), generator=g)
    per = GLOBAL_BATCH // world_size
    mine = starts[rank * per:(rank + 1) * per]
    rows = torch.stack([data[s:s + SEQ + 1] for s in mine.tolist()])
    return rows[:, :-1], rows[:, 1:]


def train_step(model: nn.Module, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step on this rank's share; FSDP2 averages the gradients over the ranks."""
    loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return loss


class AppState:
    """What DCP would take: the sharded model and optimizer state (``get_state_dict``: DTensors)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.model, self.optim = build(seed)

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


def main() -> None:
    ctx = lifeline.init()  # joins the job: ctx.rank, ctx.world_size, ctx.generation
    seed = int(ctx.settings.model.get("seed", 0))
    torch.set_num_threads(1)
    data = corpus()
    app = AppState(seed)  # sharded over the first generation's group

    def connect(timeout: timedelta | None) -> None:
        if app.model is None:  # a new generation's group (maybe another world size): shard anew on it
            app.model, app.optim = build(seed)  # the runtime then restores the checkpoint into it

    def disconnect() -> None:
        app.model = app.optim = None  # the old group's mesh goes with them

    def step(i: int) -> torch.Tensor:
        x, y = batch(data, i, dist.get_rank(), dist.get_world_size(), seed)
        return train_step(app.model, app.optim, x, y)

    try:
        lifeline.train(ctx, {"app": app}, step, connect=connect, disconnect=disconnect,
                       tokens_per_step=GLOBAL_BATCH * SEQ)
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
