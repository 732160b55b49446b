"""A recovery plan for a newer generation interrupts healthy ranks (e.g. an operator's rollback)."""

from __future__ import annotations

import torch

from lifeline.api import LayoutSpec, RecoveryPlan
from lifeline.api.pod import TrainerSettings
from lifeline.checkpoint import FilesystemStorage
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules
from lifeline.runtime import StorageCheckpointer, init, run_training
from lifeline.catalog import Catalog

from ._harness import SECRET, job_name

CFG = GPTMoEConfig(corpus_bytes=1 << 18)


class RollbackAtStep:
    """A model spec whose trainer, as a controller would, publishes a plan once ``step`` is reached."""

    def __init__(self, catalog: Catalog, step: int, plan: RecoveryPlan) -> None:
        self.catalog, self.step, self.plan, self.published = catalog, step, plan, False

    def build(self, layout, rank):
        trainer = GPTMoESpec(CFG).build(layout, rank)
        spec, train_step = self, trainer.train_step

        def step_and_maybe_publish():
            result = train_step()
            if result.step == spec.step and not spec.published:
                spec.catalog.put_plan(spec.plan)
                spec.published = True
            return result

        trainer.train_step = step_and_maybe_publish
        return trainer


def test_a_newer_plan_rolls_healthy_ranks_back_in_process(tmp_path, redis_server, capsys):
    job = job_name("plan")
    settings = TrainerSettings(job=job, rank=0, world_size=1, secret=SECRET, redis_url=redis_server.url)
    catalog = Catalog(redis_server.url, job, 1)
    ctx = init(settings)
    try:
        ck = StorageCheckpointer(FilesystemStorage(tmp_path, fsync=False), "ck", job, ctx.layout, 0, pattern_rules(CFG))
        spec = RollbackAtStep(catalog, 5, RecoveryPlan.restore_all(1, 4, LayoutSpec(), reason="roll back"))
        summary = run_training(ctx, spec, ck, steps=8, every=2)
    finally:
        ctx.close()
    assert (summary.step, summary.generation, summary.restarts, summary.restored) == (8, 1, 1, (4,))
    lines = [line for line in capsys.readouterr().out.splitlines() if '"event": "restore"' in line]
    assert len(lines) == 1 and '"generation": 1' in lines[0] and '"step": 4' in lines[0]
    # the rolled-back run ends where an uninterrupted one does
    trainer = GPTMoESpec(CFG).build(ctx.layout, 0)
    trainer.connect()
    for _ in range(8):
        trainer.train_step()
    restored = ck.restore(8, into=GPTMoESpec(CFG).build(ctx.layout, 0).state())
    for name, value in trainer.state().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(restored[name], value), name


def test_read_events_keeps_event_lines_in_order_and_skips_the_rest(tmp_path):
    from lifeline.runtime import read_events

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text('{"event": "init", "rank": 0}\nplain output\n{"event": "step", "st\n')  # cut short by a kill
    b.write_bytes(b'\xff not utf-8\n{"event": "step", "rank": 1, "step": 3}\n')
    assert read_events([a, b]) == [{"event": "init", "rank": 0}, {"event": "step", "rank": 1, "step": 3}]

