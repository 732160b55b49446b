"""A small MoE transformer split with ``torch.distributed.pipelining`` into 3 stages, under Lifeline.

The model, the split and the schedule are plain PyTorch: a byte-level transformer (embedding, 3
blocks of causal self-attention and a top-1 mixture of 4 expert MLPs, a norm and an output layer),
cut into one block per stage (the first stage also embeds, the last also predicts), each stage a
``PipelineStage`` with static shapes run by ``Schedule1F1B`` over 4 micro-batches; global
gradient-norm clipping over every stage (``Pipeline.clip_grad_norm_``: replayable), AdamW and a step
LR schedule. Lifeline appears only in ``main``: ``init()`` joins the job, ``Pipeline`` names the
stage, its schedule and the experts and routers, and ``train(..., pipeline=)`` runs the steps with
upstream logging, so that a failed stage recovers alone by localized replay (docs/pipelining.md).

The number of stages is the job's ``layout.pipeline`` (one block each; 3 in the example's job);
``spec.model.args`` may set ``schedule`` (``1f1b``, the default, or ``gpipe``) and ``micro_batches``
(default 4; 1F1B needs at least one per stage), as ``lifeline bench fuzz --model pipelining-moe`` does.

Seeded by the TrainingJob's ``spec.seed``; every rank builds the whole model from that seed and keeps
its stage; step ``s`` reads the same batch whatever happened before; deterministic algorithms and
one thread: a run with failures ends bit-identical to one without.
"""

from __future__ import annotations

import json
import pathlib
import random

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import lifeline.runtime as lifeline

VOCAB, SEQ, DIM, HEADS, EXPERTS = 256, 16, 32, 4, 4
STAGES, MICRO_BATCHES, MICRO_BATCH = 3, 4, 2  # defaults: the job's layout.pipeline and model.args override them
SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}  # spec.model.args.schedule (default 1f1b)
CLIP = 0.5  # global gradient-norm clipping (over every stage)
EXPERTS_OF, ROUTER_OF = r"block\.moe\.experts\.(?P<expert>\d+)\.", r"block\.moe\.router\."  # parameter names


class MoE(nn.Module):
    """Top-1 mixture of ``EXPERTS`` MLPs: ``x [b, t, DIM] -> [b, t, DIM]``. Every expert runs on every
    token and the router's choice masks the sum (tiny sizes: simpler than a dispatch, same result).
    ``routed`` counts the tokens sent to each expert since :meth:`take_counts`."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                     for _ in range(EXPERTS))
        self.routed = torch.zeros(EXPERTS, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.router(x).softmax(-1)
        gate, choice = probs.max(-1)
        self.routed += torch.bincount(choice.reshape(-1), minlength=EXPERTS)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + expert(x) * ((choice == e).to(x.dtype) * gate).unsqueeze(-1)
        return out

    def take_counts(self) -> list[int]:
        counts, self.routed = self.routed.tolist(), torch.zeros(EXPERTS, dtype=torch.long)
        return counts


class Block(nn.Module):
    """Pre-norm causal self-attention then the MoE, each with a residual connection."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.moe = MoE()
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class Stage(nn.Module):
    """One pipeline stage: ``[embed] -> block -> [norm, head]``. First stage: int64 ``[b, SEQ]`` token
    ids in; last stage: logits ``[b, SEQ, VOCAB]`` out; otherwise ``[b, SEQ, DIM]`` float32."""

    def __init__(self, index: int, stages: int = STAGES) -> None:
        super().__init__()
        self.first, self.last = index == 0, index == stages - 1
        if self.first:
            self.embed, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(SEQ, DIM))
        self.block = Block()
        if self.last:
            self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos
        x = self.block(x)
        return self.head(self.norm(x)) if self.last else x


def seed_everything(seed: int) -> None:
    """Seed Python's ``random`` from the job's seed (torch's generator is seeded by :func:`build_stage`).
    The example draws nothing from it, but its state is part of every checkpoint (``rng.python``) and
    of the initial state a restart from scratch loads: unseeded, a new process starts from another
    state than the first one did, and the verified restart of issue 22 finds the recomputed state
    different (fuzz seed 11 of ``--model pipelining-moe``: a Rollback to the initial state failed
    verification on ``(blob size)``, the pickled state's length)."""
    random.seed(seed)


def build_stage(index: int, seed: int, stages: int = STAGES) -> Stage:
    """Stage ``index`` of the whole ``stages``-stage model (one block per stage) built from ``seed``
    (every rank builds all, keeps one)."""
    torch.manual_seed(seed)
    return [Stage(i, stages) for i in range(stages)][index]


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross entropy of a micro-batch (nats/token)."""
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def corpus() -> torch.Tensor:
    """The bytes of ``json/__init__.py`` (ships with Python) as an int64 tensor."""
    return torch.tensor(list(pathlib.Path(json.__file__).read_bytes()), dtype=torch.long)


def batch(data: torch.Tensor, step: int, seed: int,
          micro_batches: int = MICRO_BATCHES) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch ``step`` (inputs, targets: int64 ``[micro_batches * MICRO_BATCH, SEQ]``): a
    function of (seed, step) only, not of history."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - SEQ - 1, (micro_batches * MICRO_BATCH,), generator=g)
    rows = torch.stack([data[s:s + SEQ + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def pipeline_stage(module: Stage, index: int, stages: int = STAGES) -> PipelineStage:
    """The ``PipelineStage`` of ``module`` with static shapes (one micro-batch's input and output; the
    float ones ``requires_grad``: static metadata says which tensors carry gradients across stages)."""
    x = (torch.zeros(MICRO_BATCH, SEQ, dtype=torch.long) if index == 0
         else torch.zeros(MICRO_BATCH, SEQ, DIM, requires_grad=True))
    out = torch.zeros(MICRO_BATCH, SEQ, VOCAB if index == stages - 1 else DIM, requires_grad=True)
    return PipelineStage(module, index, stages, torch.device("cpu"), input_args=x, output_args=out)


def make_step(index: int, module: Stage, schedule, optim, sched, data: torch.Tensor, seed: int, clip=None,
              stages: int = STAGES, micro_batches: int = MICRO_BATCHES):
    """The step function: one ``schedule.step`` on the batch of step ``i``, global gradient-norm
    clipping to ``CLIP`` (``clip(parameters, max_norm)``, e.g. ``Pipeline.clip_grad_norm_``; ``None``:
    none), then AdamW and the LR step. Returns the mean loss of the micro-batches on the last stage,
    ``None`` elsewhere."""
    def step(i: int) -> torch.Tensor | None:
        optim.zero_grad(set_to_none=True)
        x, y = batch(data, i, seed, micro_batches)
        losses: list[torch.Tensor] = []
        if index == 0:
            schedule.step(x)
        elif index == stages - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if clip is not None:
            clip(module.parameters(), CLIP)
        optim.step()
        sched.step()
        return torch.stack(losses).mean().detach() if losses else None
    return step


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ctx = lifeline.init()  # joins the job: ctx.rank is the stage (layout: pipeline 3)
    args = ctx.settings.model  # {"seed": spec.seed, **spec.model.args}
    seed = int(args.get("seed", 0))
    stages, micro_batches = ctx.layout.pipeline, int(args.get("micro_batches", MICRO_BATCHES))
    index = ctx.layout.coords(ctx.rank).pipeline
    seed_everything(seed)
    module = build_stage(index, seed, stages)
    stage = pipeline_stage(module, index, stages)
    schedule = SCHEDULES[str(args.get("schedule", "1f1b"))](stage, n_microbatches=micro_batches, loss_fn=loss_fn)
    optim = torch.optim.AdamW(module.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=4, gamma=0.5)
    pipeline = lifeline.Pipeline(stage, schedule, experts=EXPERTS_OF, routers=ROUTER_OF, layer=index,
                                 counts=lambda: {(index, e): n for e, n in enumerate(module.block.moe.take_counts())})
    step = make_step(index, module, schedule, optim, sched, corpus(), seed, clip=pipeline.clip_grad_norm_,
                     stages=stages, micro_batches=micro_batches)
    try:
        lifeline.train(ctx, {"model": module, "optim": optim, "sched": sched}, step, pipeline=pipeline,
                       tokens_per_step=micro_batches * MICRO_BATCH * SEQ)
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
