"""The runtime's checkpointers: in-process over storage, and through a real sidecar (L0)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
import torch

from lifeline.api.pod import SidecarSettings, TrainerSettings
from lifeline.checkpoint import FilesystemStorage, Layout, list_steps
from lifeline.errors import CheckpointError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules
from lifeline.runtime import SidecarCheckpointer, StorageCheckpointer, init, run_training, staged_key

from ._harness import SECRET, await_condition, job_name

CFG = GPTMoEConfig(corpus_bytes=1 << 18)
RULES = pattern_rules(CFG)


def tensors(state) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


def test_only_the_last_rank_of_a_generation_commits(tmp_path):
    storage = FilesystemStorage(tmp_path, fsync=False)
    layout = Layout(data=2)
    states = [GPTMoESpec(CFG).build(layout, r).state() for r in range(2)]
    ranks = [StorageCheckpointer(storage, "ck", "job", layout, r, RULES) for r in range(2)]
    ranks[0].save(2, states[0], generation=0)
    assert list_steps(storage, "ck", "job") == [] and ranks[1].latest_step() is None
    # a failed generation's leftovers never complete a later generation's checkpoint
    ranks[1].save(4, states[1], generation=0)
    ranks[0].save(4, states[0], generation=1)
    assert list_steps(storage, "ck", "job") == []
    assert storage.exists(staged_key("ck", "job", 4, 1, 0))
    ranks[1].save(2, states[1], generation=0)
    assert list_steps(storage, "ck", "job") == [2]
    ranks[1].save(4, states[1], generation=1)
    assert ranks[0].latest_step() == 4
    with pytest.raises(CheckpointError):
        StorageCheckpointer(storage, "ck", "other", layout, 0, RULES).restore(into=states[0])


def test_storage_checkpointer_restores_bit_identically(tmp_path):
    storage = FilesystemStorage(tmp_path, fsync=False)
    trainer = GPTMoESpec(CFG).build(Layout(), 0)
    trainer.connect()
    ck = StorageCheckpointer(storage, "ck", "job", Layout(), 0, RULES)
    for _ in range(3):
        trainer.train_step()
    ck.save(trainer.step, trainer.state())
    expected = tensors(trainer.state())
    fresh = GPTMoESpec(CFG).build(Layout(), 0)
    fresh.load_state(ck.restore(into=fresh.state()))
    assert fresh.step == 3
    got = tensors(fresh.state())
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


@pytest.fixture
def arena_dir():
    path = Path("/dev/shm") / f"lifeline-runtime-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_run_training_through_a_real_sidecar_restores_from_l0(tmp_path, arena_dir, redis_server):
    from lifeline.sidecar.server import Sidecar

    job = job_name("sc")
    common = dict(job=job, rank=0, world_size=1, secret=SECRET, arena_dir=arena_dir, slot_bytes=8 << 20, slots=3,
                  node="n0")
    sidecar = Sidecar(SidecarSettings(**common, redis_url=redis_server.url, pod_ip="127.0.0.1", peer_port=0,
                                      metrics_port=-1, peer_replicas=0, persist_every=0)).start()
    try:
        settings = TrainerSettings(**common, redis_url=redis_server.url, model={"corpus_bytes": 1 << 18})
        ctx = init(settings)
        try:
            ck = SidecarCheckpointer(settings, ctx.layout, RULES)
            summary = run_training(ctx, GPTMoESpec(CFG), ck, steps=4, every=2)
            assert summary.step == 4 and summary.restored == ()
            assert ck.last_receipt.stall_seconds > 0 and not ck.last_receipt.skipped
            await_condition(lambda: ck.latest_step() == 4, 30, "the sidecar to complete step 4")
            reference = StorageCheckpointer(FilesystemStorage(tmp_path, fsync=False), "ck", job, ctx.layout, 0, RULES)
            resumed = run_training(ctx, GPTMoESpec(CFG), ck, steps=6, every=2)
            assert resumed.restored == (4,) and ck.last_restore.tier == "L0"
        finally:
            ctx.close()
    finally:
        sidecar.stop()
    # the same six steps without interruption, in-process storage: identical parameters
    ctx = init(TrainerSettings(**{**common, "job": job_name("ref")}))
    try:
        trainer = GPTMoESpec(CFG).build(ctx.layout, 0)
        trainer.connect()
        for _ in range(6):
            trainer.train_step()
        reference.save(6, trainer.state())
    finally:
        ctx.close()
    into = GPTMoESpec(CFG).build(Layout(), 0).state()
    restored = tensors(reference.restore(6, into=into))
    final = tensors(trainer.state())
    assert all(torch.equal(restored[k], final[k]) for k in final)


def test_sidecar_checkpointer_reshards_from_l2_when_the_layout_changed(tmp_path, arena_dir, redis_server):
    from lifeline.checkpoint import read_manifest, save_states
    from lifeline.catalog import Catalog
    from lifeline.sidecar.server import Sidecar

    job = job_name("elastic")
    storage = FilesystemStorage(tmp_path / "l2", fsync=False)
    # step 3 saved by a data-parallel job of 2 ranks, persisted to L2 and recorded in the catalog
    old = Layout(data=2)
    trainers = [GPTMoESpec(CFG).build(old, r) for r in range(2)]
    for t in trainers:  # no process group here: both replicas read the same data and stay identical
        t.loader.replicas, t.loader.replica = 1, 0
        for _ in range(3):
            t.train_step()
    manifest = save_states(storage, "", job, 3, old, RULES, [t.state() for t in trainers])
    catalog = Catalog(redis_server.url, job, 2)
    catalog.add_holding(3, 0, "L2", None, json.dumps({"layout": old.to_dict(), "step": 3, "rank": 0}))
    catalog.close()
    assert read_manifest(storage, "", job, 3).layout == manifest.layout == old

    common = dict(job=job, rank=0, world_size=1, secret=SECRET, arena_dir=arena_dir, slot_bytes=8 << 20, slots=2,
                  node="n0")
    sidecar = Sidecar(SidecarSettings(**common, redis_url=redis_server.url, pod_ip="127.0.0.1", peer_port=0,
                                      metrics_port=-1, peer_replicas=0, persist_every=0)).start()
    try:
        settings = TrainerSettings(**common, redis_url=redis_server.url, persist_uri=str(tmp_path / "l2"))
        ck = SidecarCheckpointer(settings, Layout(), RULES)
        assert ck.saved_layout(3) == old
        fresh = GPTMoESpec(CFG).build(Layout(), 0)
        fresh.load_state(ck.restore(3, into=fresh.state()))
        assert ck.last_restore is None and fresh.step == 3
        expected = tensors(trainers[0].state())
        got = tensors(fresh.state())
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        no_l2 = SidecarCheckpointer(TrainerSettings(**common, redis_url=redis_server.url), Layout(), RULES,
                                    client=ck.client)
        with pytest.raises(CheckpointError):
            no_l2.restore(3, into=fresh.state())
    finally:
        sidecar.stop()


def test_a_job_started_again_in_another_layout_resumes_from_l2(tmp_path, arena_dir, redis_server):
    """The catalog is new (a TrainingJob deleted and applied again, now in another layout): the
    checkpointer's latest step is the latest one committed to L2, read resharded into this layout."""
    from lifeline.checkpoint import save_states
    from lifeline.sidecar.server import Sidecar

    job = job_name("again")
    storage = FilesystemStorage(tmp_path / "l2", fsync=False)
    old = Layout(data=2)
    trainers = [GPTMoESpec(CFG).build(old, r) for r in range(2)]
    for t in trainers:
        t.loader.replicas, t.loader.replica = 1, 0
        for _ in range(2):
            t.train_step()
    save_states(storage, "", job, 2, old, RULES, [t.state() for t in trainers])
    common = dict(job=job, rank=0, world_size=1, secret=SECRET, arena_dir=arena_dir, slot_bytes=8 << 20, slots=2,
                  node="n0")
    sidecar = Sidecar(SidecarSettings(**common, redis_url=redis_server.url, pod_ip="127.0.0.1", peer_port=0,
                                      metrics_port=-1, peer_replicas=0, persist_every=0)).start()
    try:
        ck = SidecarCheckpointer(TrainerSettings(**common, redis_url=redis_server.url,
                                                 persist_uri=str(tmp_path / "l2")), Layout(), RULES)
        assert ck.client.latest_complete_step() is None  # nothing in the catalog
        assert ck.latest_step() == 2 and ck.saved_layout(2) == old
        fresh = GPTMoESpec(CFG).build(Layout(), 0)
        fresh.load_state(ck.restore(2, into=fresh.state()))
        assert fresh.step == 2 and ck.last_reshard is not None and ck.last_reshard.bytes_by_tier["L2"] > 0
        expected, got = tensors(trainers[0].state()), tensors(fresh.state())
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        without_l2 = SidecarCheckpointer(TrainerSettings(**common, redis_url=redis_server.url), Layout(), RULES,
                                         client=ck.client)
        assert without_l2.latest_step() is None  # a new job: starts from its initial state
    finally:
        sidecar.stop()
