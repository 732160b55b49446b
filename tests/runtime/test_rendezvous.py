"""Rendezvous of real processes through a real Redis: no DNS, addresses from the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from lifeline.api.pod import TrainerSettings
from lifeline.errors import ConfigError, RecoveryError
from lifeline.api import LayoutSpec, RecoveryPlan
from lifeline.runtime import init
from lifeline.catalog import Catalog

from ._harness import SECRET, events, job_name, rank_env, start, wait_all

WORKER = str(Path(__file__).with_name("_rdzv_worker.py"))


def run_world(tmp_path: Path, redis_url: str, job: str, world: int, **extra: str) -> dict[int, dict]:
    logs = {r: tmp_path / f"{job}-rank-{r}.log" for r in range(world)}
    procs = {r: start([WORKER], rank_env(job, r, world, redis_url, **extra), logs[r]) for r in range(world)}
    wait_all(procs, logs, timeout=120)
    return {r: [e for e in events(logs[r]) if "sum" in e][0] for r in range(world)}


def test_four_processes_meet_through_redis(tmp_path, redis_server):
    job = job_name("rdzv")
    out = run_world(tmp_path, redis_server.url, job, 4)
    assert {r: (o["sum"], o["world"], o["generation"]) for r, o in out.items()} == {r: (10.0, 4, 0) for r in range(4)}
    address = redis.Redis.from_url(redis_server.url, decode_responses=True).get(f"lifeline:{job}:rdzv:0")
    assert Catalog(redis_server.url, job, 4).rendezvous_key(0) == f"lifeline:{job}:rdzv:0"
    assert address.startswith("127.0.0.2:"), "rank 0 published its pod IP and store port"


def test_ranks_join_the_catalogs_current_generation(tmp_path, redis_server):
    job = job_name("rdzv")
    Catalog(redis_server.url, job, 2).put_plan(RecoveryPlan.restore_all(3, None, LayoutSpec(data=2)))
    out = run_world(tmp_path, redis_server.url, job, 2)
    assert [o["generation"] for o in out.values()] == [3, 3]
    assert redis.Redis.from_url(redis_server.url).exists(f"lifeline:{job}:rdzv:3")


def test_a_missing_rank_zero_is_a_recovery_error_naming_the_key(redis_server):
    job = job_name("rdzv")
    settings = TrainerSettings.load(job=job, rank=1, world_size=2, secret=SECRET, redis_url=redis_server.url,
                                    rendezvous_timeout_seconds=0.3)
    with pytest.raises(RecoveryError) as err:
        init(settings)
    assert err.value.key == f"lifeline:{job}:rdzv:0"
    assert "rank 0" in str(err.value)


def test_bad_runtime_settings_name_the_field(redis_server):
    with pytest.raises(ConfigError) as err:
        init(TrainerSettings.load(job="x", rank=0, world_size=2, secret=SECRET))
    assert err.value.field == "redis_url"
    with pytest.raises(ConfigError) as err:
        init(TrainerSettings.load(job="x", rank=0, world_size=4, secret=SECRET, redis_url=redis_server.url,
                                  layout={"pipeline": 3}))
    assert err.value.field == "layout"


def test_single_rank_needs_no_catalog():
    ctx = init(TrainerSettings.load(job=job_name("solo"), rank=0, world_size=1, secret=SECRET))
    try:
        import torch.distributed as dist

        assert dist.is_initialized() and dist.get_world_size() == 1 and ctx.generation == 0
    finally:
        ctx.close()
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_a_stale_address_is_read_again_until_the_live_rank_zero_publishes(redis_server):
    """Rank 0 of a generation died after publishing (e.g. a pod an elastic reshard replaced); its
    replacement publishes anew. A rank that read the stale address must not wait out its whole
    deadline on it: it reads the key again and meets the live rank 0."""
    import socket
    import threading

    from lifeline.runtime._rendezvous import rendezvous

    job = job_name("rdzv")
    catalog = Catalog(redis_server.url, job, 2)
    with socket.socket() as s:  # a port nothing listens on any more
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    catalog.publish_rendezvous(0, f"127.0.0.1:{dead}", 60)
    got: dict = {}
    worker = threading.Thread(target=lambda: got.update(store=rendezvous(
        catalog, rank=1, world_size=2, generation=0, pod_ip="127.0.0.1", timeout=60)), daemon=True)
    worker.start()
    master = rendezvous(Catalog(redis_server.url, job, 2), rank=0, world_size=2, generation=0,
                        pod_ip="127.0.0.1", timeout=60)
    worker.join(timeout=60)
    assert "store" in got, "rank 1 never connected to the live rank 0's store"
    got["store"].set("hello", "world")
    assert master.get("hello") == b"world"
