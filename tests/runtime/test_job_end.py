"""A finished rank stays until every rank finished (runtime/_durable.py ``JobEnd``), on a real Redis: a
failure of another rank after it finished is a recovery it takes part in (issue 26, trial 2006)."""

from __future__ import annotations

from lifeline.api.pod import TrainerSettings
from lifeline.catalog import Catalog, ProgressReport
from lifeline.checkpoint import Layout
from lifeline.runtime import RuntimeContext
from lifeline.runtime._durable import JobEnd

from ._harness import SECRET, job_name


def _ctx(redis_url: str, job: str, rank: int, world: int, **settings) -> RuntimeContext:
    s = TrainerSettings(job=job, rank=rank, world_size=world, secret=SECRET, redis_url=redis_url, **settings)
    return RuntimeContext(settings=s, layout=Layout(data=world), rank=rank, world_size=world, generation=3,
                          backend="gloo", catalog=Catalog(redis_url, job, world))


def test_a_finished_rank_waits_for_every_rank_to_finish_in_its_generation(redis_server):
    job = job_name("end")
    ctx = _ctx(redis_server.url, job, 0, 3)
    peers = Catalog(redis_server.url, job, 3)
    end = JobEnd(ctx, poll=0.01)
    assert not end.ended(step=8) and end.reported
    assert peers.progress()[0].event == "done" and peers.progress()[0].step == 8
    peers.report(ProgressReport("done", job, 1, 3, 1.0, 8))
    peers.report(ProgressReport("done", job, 2, 2, 1.0, 8))  # done in an older generation: not this one's end
    assert not end.ended(step=8)
    peers.report(ProgressReport("step", job, 2, 3, 2.0, 8))
    assert not end.ended(step=8)
    peers.report(ProgressReport("done", job, 2, 3, 3.0, 8))
    assert end.ended(step=8)
    assert [r.event for r in peers.progress().values()] == ["done"] * 3  # one done report, no other after it


def test_past_its_timeout_a_rank_finishes_alone_and_a_recovery_makes_it_report_again(redis_server):
    job = job_name("alone")
    ctx = _ctx(redis_server.url, job, 1, 2)
    end = JobEnd(ctx, poll=0.01, timeout=0.05)
    catalog = Catalog(redis_server.url, job, 2)
    while not end.ended(step=4):  # rank 0 never reports done
        pass
    catalog.report(ProgressReport("failure", job, 1, 3, 1.0, 4))  # a late failure: this rank recovered
    end.reset()
    assert not end.reported
    assert not JobEnd(ctx, poll=0.01).ended(step=4)
    assert catalog.progress()[1].event == "done", "it reports done again after the recovery"


def test_without_a_catalog_or_alone_a_rank_ends_at_once(redis_server):
    ctx = _ctx(redis_server.url, job_name("one"), 0, 1)
    assert JobEnd(ctx).ended(step=1)
