"""A plain PyTorch DDP training script under Lifeline (docs/sdk.md).

A tiny character model — the previous 8 bytes embedded, then a two-layer MLP predicting the next
byte — trained with AdamW and a step LR schedule on the source of the standard library's ``json``
package, data parallel over gloo on CPU. The model, the data and the step are plain PyTorch;
Lifeline appears only in ``main``: ``init()`` joins the job (rank, world size, generation) and
``train()`` runs the steps, checkpoints ``model``/``optim``/``sched`` (and the RNG) every
``checkpoint.every`` steps and recovers in this process when a peer is lost.

Seeded by the TrainingJob's ``spec.seed`` (``LIFELINE_MODEL``); step ``s`` reads the same global
batch whatever happened before, so a run with failures ends bit-identical to one without.
"""

from __future__ import annotations

import json
import os
import pathlib
from datetime import timedelta

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lifeline.runtime as lifeline

CONTEXT, BATCH, VOCAB = 8, 16, 256  # bytes of context, samples per rank per step, byte vocabulary


class CharMLP(nn.Module):
    """Next byte from the previous ``CONTEXT`` bytes: embedding, flatten, Linear-ReLU-Linear."""

    def __init__(self, dim: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(CONTEXT * dim, hidden), nn.ReLU(), nn.Linear(hidden, VOCAB))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, CONTEXT] int64 -> logits [batch, VOCAB]
        return self.mlp(self.embed(x))


def corpus() -> torch.Tensor:
    """The bytes of ``json/__init__.py`` (ships with Python) as an int64 tensor."""
    return torch.tensor(list(pathlib.Path(json.__file__).read_bytes()), dtype=torch.long)


def batch(data: torch.Tensor, step: int, rank: int, world_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s slice of global batch ``step``: a function of (seed, step) only, not of history."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - CONTEXT - 1, (world_size * BATCH,), generator=g)
    mine = starts[rank * BATCH:(rank + 1) * BATCH]
    x = torch.stack([data[s:s + CONTEXT] for s in mine.tolist()])
    return x, data[mine + CONTEXT]


def main() -> None:
    ctx = lifeline.init()  # joins the job: ctx.rank, ctx.world_size, ctx.generation
    seed = int(ctx.settings.model.get("seed", 0))
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = corpus()
    # scripts/gpu_check.sh runs it on a GPU (LIFELINE_EXAMPLE_DEVICE=cuda); CPU otherwise
    device = torch.device("cuda" if os.environ.get("LIFELINE_EXAMPLE_DEVICE") == "cuda" else "cpu")
    model = CharMLP().to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
    ddp: list[DistributedDataParallel] = []  # rebuilt on every generation of the process group

    def connect(timeout: timedelta | None) -> None:
        ddp[:] = [DistributedDataParallel(model)]

    def disconnect() -> None:
        ddp.clear()

    def step(i: int) -> torch.Tensor:
        x, y = batch(data, i, ctx.rank, ctx.world_size, seed)
        loss = nn.functional.cross_entropy(ddp[0](x.to(device)), y.to(device))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sched.step()
        return loss

    try:
        lifeline.train(ctx, {"model": model, "optim": optim, "sched": sched}, step, connect=connect,
                       disconnect=disconnect, tokens_per_step=BATCH * ctx.world_size)
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
