"""``bench crash`` sidecar target: real sidecars persisting to MinIO, one SIGKILLed at a random moment of a step.

Two data-parallel ranks, each a real :class:`~lifeline.sidecar.server.Sidecar` forked from the zygote
(L0 arena in ``/dev/shm``, catalog in a real Redis, L2 in the bench's MinIO, ``persist_every=1``); the
bench plays both trainers (:class:`~lifeline.sidecar.client.SidecarClient`). A trial saves one step on
both ranks and SIGKILLs one rank's sidecar, chosen at random, at a uniformly random time within
``D`` (the median time from the start of a save to the step's L2 commit being recorded in the
catalog): the kill lands while the trainer hands over the bytes, while the sidecar seals, uploads its
blob, or while the completing rank commits the manifest and records the L2 holdings. The killed
sidecar is restarted (same arena) before the next trial. The reader then checks MinIO and the catalog.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
from pathlib import Path

from lifeline._poll import wait_for
from lifeline.bench._crash_check import Counts, Reader
from lifeline.bench._crash_proc import Zygote, sigkill
from lifeline.bench._crash_state import sidecar_state
from lifeline.errors import LifelineError

WORLD = 2
NUMEL = 256 << 10
"""fp32 elements of each rank's ``weight`` (1 MiB): a single-PUT blob of ~1 MiB per rank per step."""
SECRET = "bench-crash-job-secret-0123456789"


def _settings(minio, redis_url: str, job: str, bucket: str, arena_root: Path) -> list[dict]:
    return [{"job": job, "rank": r, "world_size": WORLD, "secret": SECRET, "arena_dir": str(arena_root / f"r{r}"),
                 "slot_bytes": 2 << 20, "slots": 3, "node": f"n{r}", "redis_url": redis_url, "pod_ip": "127.0.0.1", "peer_port": 0,
                 "metrics_port": -1, "heartbeat_seconds": 0.3, "peer_replicas": 0, "persist_every": 1, "persist_retries": 2,
                 "persist_uri": f"s3://{bucket}/ckpt", "s3_endpoint": minio.endpoint, "s3_access_key": minio.access_key,
                 "s3_secret_key": minio.secret_key} for r in range(WORLD)]


def _save_all(settings: list[dict], step: int, seed: int, errors: list[str]) -> list[threading.Thread]:
    """Start one trainer thread per rank saving ``step``; a failure (its sidecar killed) goes to ``errors``."""
    from lifeline.api.pod import TrainerSettings
    from lifeline.sidecar.client import SidecarClient

    state = sidecar_state(seed, NUMEL)

    def one(s: dict) -> None:
        try:
            t = TrainerSettings(**{k: s[k] for k in ("job", "rank", "world_size", "secret", "arena_dir", "slot_bytes",
                                                     "slots", "node")}, wait_timeout_seconds=30,
                                connect_timeout_seconds=30)
            with SidecarClient(t) as client:
                client.save(step, state)
        except (LifelineError, OSError) as err:
            errors.append(f"rank {s['rank']}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=one, args=(s,), name=f"crash-trainer-{s['rank']}") for s in settings]
    for t in threads:
        t.start()
    return threads


def run_sidecar(minio, trials: int, rng: random.Random, root: Path) -> dict:
    """Run ``trials`` sidecar kill trials against ``minio`` (a started MinioServer); returns the JSON row."""
    from lifeline.catalog import Catalog
    from lifeline.checkpoint import S3Storage, list_steps
    from lifeline.devcluster.services import RedisServer

    counts = Counts()
    t0 = time.perf_counter()
    job, bucket = f"crash{uuid.uuid4().hex[:8]}", f"crash-sc-{uuid.uuid4().hex[:8]}"
    storage = S3Storage(minio.endpoint, minio.access_key, minio.secret_key, bucket)
    if not storage.client.bucket_exists(bucket):
        storage.client.make_bucket(bucket)
    arena_root = Path("/dev/shm") / f"lifeline-bench-crash-{uuid.uuid4().hex[:8]}"
    redis = RedisServer(state_dir=root / "redis").start()
    settings = _settings(minio, redis.url, job, bucket, arena_root)
    zygote = Zygote({"target": "sidecar", "sidecars": settings}, root / "zygote-sidecar.log")
    catalog = Catalog(redis.url, job, WORLD)
    reader = Reader(storage, "ckpt", job, lambda seed: sidecar_state(seed, NUMEL), counts)
    attempts: dict[int, int] = {}
    pids: dict[int, int] = {}
    errors: list[str] = []
    handoff_failed = 0

    def start(rank: int) -> None:
        zygote.send(f"sidecar {rank}")
        pids[rank] = int(zygote.expect(f"sidecar {rank}")[0])

    def l2_recorded(step: int) -> bool:
        return all("L2" in catalog.holder_names(step, r) for r in range(WORLD))

    try:
        for r in range(WORLD):
            start(r)
        durations = []
        for step in range(3):  # calibration: whole saves, timed to the L2 commit recorded in the catalog
            attempts[step] = seed = rng.getrandbits(31)
            t_save = time.perf_counter()
            for t in _save_all(settings, step, seed, errors):
                t.join()
            if errors:
                raise LifelineError(f"bench crash: a calibration save failed: {errors}")
            wait_for(lambda step=step: l2_recorded(step), timeout=60, what=f"step {step} committed to L2",
                     interval=0.002)
            durations.append(time.perf_counter() - t_save)
            reader.check(attempts, step)
        bound = statistics.median(durations)
        for step in range(3, 3 + trials):
            attempts[step] = seed = rng.getrandbits(31)
            victim = rng.randrange(WORLD)
            delay = rng.uniform(0.0, bound)
            errors.clear()
            threads = _save_all(settings, step, seed, errors)
            time.sleep(delay)  # the random moment of the crash is the point of the bench
            sigkill(pids[victim])
            for t in threads:
                t.join(60)
            handoff_failed += bool(errors)
            counts.trials += 1
            reader.check(attempts, step)
            # visible = the catalog recorded the L2 commit or the manifest is listed (reader.known)
            if step in reader.known or any("L2" in catalog.holder_names(step, r) for r in range(WORLD)):
                counts.killed_after_commit += 1
            else:
                counts.killed_before_commit += 1
            _check_catalog(catalog, reader, counts)
            start(victim)  # restarted in place: same arena, same settings
        # a restarted sidecar may have persisted a step it found in its arena meanwhile: read once more
        reader.check(attempts)
        _check_catalog(catalog, reader, counts)
        reader.final()
        listed = set(list_steps(storage, "ckpt", job))
        stranded = [s for s in range(3, 1 + trials) if catalog.committer(s) is not None and s not in listed
                    and s not in reader.deleted]
    finally:
        zygote.close()
        catalog.close()
        redis.stop()
        import shutil

        shutil.rmtree(arena_root, ignore_errors=True)
    counts.seconds = time.perf_counter() - t0
    return {"trials": counts.trials, "killed_before_commit": counts.killed_before_commit,
            "killed_after_commit": counts.killed_after_commit, "committed_and_valid": counts.committed_and_valid,
            "torn_visible": counts.torn_visible, "committed_lost": counts.committed_lost,
            "handoff_failed": handoff_failed, "l2_commit_stranded": len(stranded), "commit_seconds_median": round(bound, 4),
            "seconds": round(counts.seconds, 2), "problems": counts.problems}


def _check_catalog(catalog, reader: Reader, counts: Counts) -> None:
    """A step the catalog records as held at L2 must have its manifest in MinIO (unless the bench deleted it)."""
    listed = None
    for step in catalog.steps():
        if step in reader.deleted or step in reader.known:
            continue
        if any("L2" in catalog.holder_names(step, r) for r in range(WORLD)):
            if listed is None:
                from lifeline.checkpoint import list_steps

                listed = set(list_steps(reader.storage, reader.prefix, reader.job))
            if step not in listed:
                counts.torn(f"step {step}: the catalog records an L2 copy but MinIO has no manifest")
