"""Kill a rank mid-run: survivors recover in-process, a replacement joins generation + 1, and the
run ends bit-identical to a failure-free one (DESIGN.md invariant 1). Real Redis, real gloo."""

from __future__ import annotations

import json
import signal

import pytest

from lifeline.api import LayoutSpec, RecoveryPlan
from lifeline.checkpoint import Layout, blob_key, consolidate, list_steps, storage_from_uri
from lifeline.catalog import Catalog

from ._harness import await_condition, events, job_name, rank_env, start, stop, wait_all

pytestmark = pytest.mark.slow  # multi-process torch runs: not in the fast local suite (docs/testing.md)

WORLD = 4
LAYOUT = json.dumps({"pipeline": 2, "data": 2})
STEPS = 16
EVERY = 2
TRAINER = ["-m", "lifeline", "trainer"]


def trainer_env(job, rank, redis_url, ckpt_uri, **extra):
    return rank_env(job, rank, WORLD, redis_url, LIFELINE_LAYOUT=LAYOUT, LIFELINE_STEPS=str(STEPS),
                    LIFELINE_CHECKPOINT_EVERY=str(EVERY), LIFELINE_CHECKPOINT_URI=ckpt_uri, **extra)


def launch(tmp_path, job, redis_url, ckpt_uri):
    logs = {r: tmp_path / f"{job}-rank-{r}.log" for r in range(WORLD)}
    procs = {r: start(TRAINER, trainer_env(job, r, redis_url, ckpt_uri), logs[r]) for r in range(WORLD)}
    return procs, logs


def progress_step(catalog: Catalog, rank: int) -> int:
    report = catalog.progress().get(rank)
    return (report.step or 0) if report is not None else 0


def final_state(ckpt_uri: str, job: str) -> tuple[dict, dict]:
    storage, prefix = storage_from_uri(ckpt_uri)
    blobs = {rank: storage.get(blob_key(prefix, job, STEPS, rank)) for rank in range(WORLD)}
    return blobs, consolidate(storage, prefix, job, STEPS)


def test_kill_a_rank_survivors_recover_in_process_and_end_bit_identical(tmp_path, redis_server):
    url = redis_server.url

    # the failure-free reference run
    ref_job, ref_uri = job_name("ref"), str(tmp_path / "ref-ckpt")
    procs, logs = launch(tmp_path, ref_job, url, ref_uri)
    wait_all(procs, logs)

    # the same spec and layout; rank 0 (which also hosts the generation's rendezvous store) is killed
    job, uri = job_name("fail"), str(tmp_path / "fail-ckpt")
    victim = 0
    procs, logs = launch(tmp_path, job, url, uri)
    try:
        catalog = Catalog(url, job, WORLD)
        await_condition(lambda: progress_step(catalog, victim) >= 5, 120, "rank 0 to pass step 5")
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        storage, prefix = storage_from_uri(uri)
        # the controller's part (lifeline.control/launch in production): plan generation 1 from the
        # latest committed checkpoint, then start the replacement rank
        restore_step = max(list_steps(storage, prefix, job))
        catalog.put_plan(RecoveryPlan.restore_all(1, restore_step, LayoutSpec(pipeline=2, data=2),
                                                  reason=f"replace rank {victim}"))
        killed_log = logs[victim]
        logs[victim] = tmp_path / f"{job}-rank-{victim}-replacement.log"
        procs[victim] = start(TRAINER, trainer_env(job, victim, url, uri), logs[victim])
        survivors = {r: procs[r].pid for r in range(WORLD) if r != victim}
        wait_all(procs, logs)
    finally:
        stop(procs)

    assert any(e["event"] == "step" and e["step"] >= 5 for e in events(killed_log))
    for rank in range(WORLD):
        evs = events(logs[rank])
        restores = [e for e in evs if e["event"] == "restore"]
        assert restores and restores[-1]["step"] == restore_step and restores[-1]["generation"] == 1, rank
        done = [e for e in evs if e["event"] == "done"]
        assert done and done[0]["step"] == STEPS and done[0]["generation"] == 1
        if rank in survivors:
            assert any(e["event"] == "failure" and e["generation"] == 0 for e in evs), rank
            assert done[0]["restarts"] == 1
            assert procs[rank].pid == survivors[rank], "the survivor's process was never restarted"
    assert 0 < restore_step < STEPS

    ref_blobs, ref_tensors = final_state(ref_uri, ref_job)
    blobs, tensors = final_state(uri, job)
    for rank in range(WORLD):
        assert blobs[rank] == ref_blobs[rank], f"rank {rank}'s final shard differs from the failure-free run"
    assert ref_tensors.keys() == tensors.keys()
    for name in ref_tensors:
        assert ref_tensors[name].equal(tensors[name]), name
    assert Layout(pipeline=2, data=2).world_size == WORLD
