"""One rank of the pipelining adapter's test: ``python _pipelining_worker.py RANK OUT_DIR STEPS``.

The 3-stage MoE of examples/pipelining-moe (4 micro-batches; ``Schedule1F1B``, then again with
``ScheduleGPipe``) runs ``STEPS`` live steps over gloo (a ``FileStore``, loopback) under a :class:`~lifeline.runtime.PipelineTrainer`,
recording its upstream log in a dict. The state before the last step, the final state, every log
entry and the live losses are written to ``OUT_DIR/<schedule>-rank-<r>.pt``. After a barrier every rank loads
its neighbours' logs, restores the state before the last step and replays that step from them
alone: first with the entries of micro-batches >= 2 missing (the replay fails part-way and the rank
drops the partial step with ``abandon_step``), then whole; it writes the replayed final state, loss
and re-logged entries to ``OUT_DIR/<schedule>-replay-<r>.pt``. Stage 1 also tries two stages
``Pipeline`` must refuse (``OUT_DIR/refused-<r>.pt``: the errors' messages).
"""

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe

from lifeline.errors import ConfigError
from lifeline.runtime import Pipeline, PipelineTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipelining-moe" / "train.py"


def example():
    spec = importlib.util.spec_from_file_location("pipelining_moe_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DictLog:
    """The StageLog / ReplaySource protocol over dicts: own entries, and the neighbours' once loaded."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int, str], torch.Tensor] = {}
        self.neighbours: dict[tuple[int, int, int, str], torch.Tensor] = {}

    def record(self, iteration: int, micro_batch: int, direction: str, tensor: torch.Tensor) -> None:
        self.entries[(iteration, micro_batch, direction)] = tensor.clone()

    def fetch(self, out, *, iteration, micro_batch, stage, direction, rank) -> None:
        out.copy_(self.neighbours[(rank, iteration, micro_batch, direction)])


def snapshot(trainer) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else bytes(v) for k, v in trainer.state().items()}


def refusals(ex, module, rank: int) -> list[str]:
    """The ConfigErrors of stages ``Pipeline`` must refuse: no static shapes; a float input that does
    not say it carries gradients (stage 1 only; the others return [])."""
    if rank != 1:
        return []
    x = torch.zeros(ex.MICRO_BATCH, ex.SEQ, ex.DIM)
    out = []
    for stage in (ex.PipelineStage(module, 1, ex.STAGES, torch.device("cpu")),
                  ex.PipelineStage(module, 1, ex.STAGES, torch.device("cpu"), input_args=x, output_args=x)):
        try:
            Pipeline(stage, ex.Schedule1F1B(stage, n_microbatches=ex.MICRO_BATCHES, loss_fn=ex.loss_fn))
        except ConfigError as err:
            out.append(str(err))
    return out


def run(ex, rank: int, out: Path, steps: int, schedule_cls, tag: str) -> None:
    """Live steps, then the interrupted and the whole replay of the last one (see the module docstring);
    files ``<tag>-rank-<r>.pt`` and ``<tag>-replay-<r>.pt``."""
    module = ex.build_stage(rank, 3)
    stage = ex.pipeline_stage(module, rank)
    schedule = schedule_cls(stage, n_microbatches=ex.MICRO_BATCHES, loss_fn=ex.loss_fn)
    optim = torch.optim.AdamW(module.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)
    pipeline = Pipeline(stage, schedule)
    step_fn = ex.make_step(rank, module, schedule, optim, sched, ex.corpus(), 3, clip=pipeline.clip_grad_norm_)
    trainer = PipelineTrainer(pipeline, {"model": module, "optim": optim, "sched": sched}, step_fn)
    log = DictLog()
    trainer.log = log
    losses = []
    before = None
    for step in range(steps):
        if step == steps - 1:
            before = snapshot(trainer)
        losses.append(trainer.train_step().loss)
    torch.save({"before": before, "after": snapshot(trainer), "log": log.entries, "losses": losses},
               out / f"{tag}-rank-{rank}.pt")
    dist.barrier()
    for peer in (rank - 1, rank + 1):
        if 0 <= peer < ex.STAGES:
            for (it, mb, d), t in torch.load(out / f"{tag}-rank-{peer}.pt")["log"].items():
                log.neighbours[(peer, it, mb, d)] = t
    trainer.load_state(before)
    own, log.entries = log.entries, {}
    whole, log.neighbours = log.neighbours, {k: v for k, v in log.neighbours.items() if k[2] < 2}
    try:
        trainer.replay_step(log)
        raise AssertionError("a replay with missing log entries went through")
    except KeyError:
        trainer.abandon_step()  # a partial step: received buffers, cached activations, gradients
    partial = trainer.step
    log.neighbours, log.entries = whole, {}
    result = trainer.replay_step(log)
    torch.save({"after": snapshot(trainer), "loss": result.loss, "step": result.step, "relogged": log.entries,
                "partial_step": partial, "logged": {k: v for k, v in own.items() if k[0] == steps - 1}},
               out / f"{tag}-replay-{rank}.pt")


def main() -> None:
    rank, out, steps = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ex = example()
    dist.init_process_group("gloo", store=dist.FileStore(str(out / "store"), ex.STAGES), rank=rank,
                            world_size=ex.STAGES, timeout=timedelta(seconds=60))
    torch.save(refusals(ex, ex.build_stage(rank, 3), rank), out / f"refused-{rank}.pt")
    run(ex, rank, out, steps, ex.Schedule1F1B, "1f1b")
    run(ex, rank, out, steps, ScheduleGPipe, "gpipe")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
