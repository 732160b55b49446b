"""The sidecar bench's runs through real sidecars (separate ``lifeline sidecar`` processes), with every
peer interleaved: each repetition runs one of every peer, back to back, under the same machine load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import torch

from lifeline.api.pod import TrainerSettings
from lifeline.bench._sidecar_dlrover import DLRover
from lifeline.bench._sidecar_peers import DcpAsync, Memcpy, PlainUpload, RawTcp, TorchSave, wait
from lifeline.checkpoint import Layout, PatternRules, plan_shard
from lifeline.devcluster.services import MinioServer
from lifeline.catalog import Catalog
from lifeline.sidecar.client import SidecarClient

__all__ = ["SidecarProcess", "sidecar_env", "sidecar_runs", "WARM"]

State = dict[str, torch.Tensor]


class SidecarProcess:
    """``lifeline sidecar`` in its own session with environment ``env``, output to ``log``."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.fh = open(log, "wb")
        self.p = subprocess.Popen([sys.executable, "-m", "lifeline", "sidecar"], env=env, stdout=self.fh,
                                  stderr=subprocess.STDOUT, start_new_session=True)

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON event lines named ``name`` the sidecar logged so far (dicts, in order)."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == name:
                    out.append(rec)
        return out

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after 30 s; close the log."""
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.fh.close()


def sidecar_env(job: str, rank: int, world: int, node: str, ip: str, arena: Path, slot_bytes: int, redis_url: str,
                **extra: Any) -> dict[str, str]:
    """This process's environment plus the sidecar's ``LIFELINE_*`` settings for one rank (``extra``:
    more settings, names upper-cased); ``slot_bytes`` in bytes."""
    env = dict(os.environ)
    base = dict(JOB=job, RANK=rank, WORLD_SIZE=world, NODE=node, POD_IP=ip, ARENA_DIR=arena, SLOTS=2,
                SLOT_BYTES=slot_bytes, REDIS_URL=redis_url, SECRET="bench-secret-0123456789", PEER_PORT=0,
                METRICS_PORT=-1, KEEP=1, HEARTBEAT_SECONDS=0.5, MEMORY_BYTES=4 * slot_bytes, PERSIST_EVERY=0,
                LOG_LEVEL="INFO")
    base.update({k.upper(): v for k, v in extra.items()})
    env.update({f"LIFELINE_{k}": str(v) for k, v in base.items()})
    return env


WARM = 2  # warm-up saves: the receiver reaches its steady state (two replica buffers in rotation, faulted in)


def sidecar_runs(state: State, nbytes: int, reps: int, workdir: Path, disk: Path, redis_url: str,
                 minio: MinioServer) -> dict[str, Any]:
    """Both runs for one state: stall + replication (two sidecars, rank 0 → rank 1) beside their peers,
    then persistence (one sidecar, L2 every step) beside a plain upload.

    Args:
        state: the trainer's tensors; ``nbytes``: their size in bytes.
        reps: measured repetitions (after :data:`WARM` warm-up saves; one for persistence).
        workdir: the sidecars' arenas and logs (``/dev/shm``); ``disk``: local disk for torch.save/DCP/DLRover.
        redis_url: the catalog's Redis; ``minio``: the MinIO server for L2 and the plain upload.

    Returns:
        Per-peer sample lists in seconds (what ``raw.sidecar`` of the bench's JSON holds).

    Raises:
        TimeoutError: a replication or persistence did not show in the catalog within 600 s.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    plan = plan_shard(state, Layout(data=2), 0, PatternRules([]))
    slot = plan.nbytes
    res: dict[str, Any] = {}
    # run 1: stall + replication (rank 0 on node a / 127.0.0.1 → rank 1 on node b / 127.0.0.2)
    job = f"bench-{uuid.uuid4().hex[:6]}"
    a_env = sidecar_env(job, 0, 2, "a", "127.0.0.1", workdir / "a", slot, redis_url, PEER_REPLICAS=1)
    b_env = sidecar_env(job, 1, 2, "b", "127.0.0.2", workdir / "b", 1 << 20, redis_url, PEER_REPLICAS=1,
                 MEMORY_BYTES=3 * slot)
    a, b = SidecarProcess(a_env, workdir / "a.log"), SidecarProcess(b_env, workdir / "b.log")
    cat = Catalog(redis_url, job, 2)
    try:
        settings = TrainerSettings(**{k[9:].lower(): v for k, v in a_env.items() if k.startswith("LIFELINE_")
                                      and k[9:] in ("JOB", "RANK", "WORLD_SIZE", "NODE", "SECRET", "ARENA_DIR",
                                                    "SLOTS", "SLOT_BYTES")})
        tsave, dcp = TorchSave(state, disk), DcpAsync(state, disk)
        dl = DLRover(nbytes, disk)
        memcpy = Memcpy(state)
        memcpy()  # the destination now holds the state's bytes: the raw TCP peer sends those
        tcp = RawTcp(memoryview(memcpy.dst.numpy()))
        try:
            with SidecarClient(settings) as client:
                stalls, waits, floor, floor2, raw, saves, dcps, dls = [], [], [], [], [], [], [], []
                for step in range(reps + WARM):  # peers interleaved with the sidecar: both see the same load
                    floor.append(memcpy())
                    floor2.append(memcpy.parallel())
                    r = client.save(step, state, plan)
                    stalls.append(r.stall_seconds)
                    waits.append(r.waited_seconds)
                    wait(lambda s=step: "L1@1" in cat.holder_names(s, 0), 600, f"replication of step {step}")
                    raw.append(tcp())
                    saves.append(tsave())
                    dcps.append(dcp())
                    dls.append(dl())
        finally:
            tcp.close()
            memcpy.close()
            dcp.close()
            dl.close()
        del tcp, memcpy
        rep = [e["seconds"] for e in a.events("replicated")]
        res["warmup"] = {"raw_tcp_s": raw[:WARM], "replication_s": rep[:WARM], "sidecar_stall_s": stalls[:WARM],
                         "torch_save_s": saves[:WARM], "dcp_blocking_s": [x[0] for x in dcps[:WARM]]}
        res["raw_tcp_s"] = raw[WARM:]
        res["torch_save_s"] = saves[WARM:]
        res["dlrover"] = ({"ran": True, "stall_s": dls[WARM:], "warmup_s": [dl.first_s, *dls[:WARM]],
                           "attempts": dl.attempts} if dl.ran and None not in dls else
                          {"ran": False, "why": dl.why or f"a save failed: {dl.log.read_text(errors='replace')[-1500:]}"})
        res["dcp"] = {"blocking_s": [x[0] for x in dcps[WARM:]], "complete_s": [x[1] for x in dcps[WARM:]]}
        res["memcpy_s"] = floor[WARM:]
        res["memcpy_parallel_s"] = floor2[WARM:]
        res["sidecar_stall_s"] = stalls[WARM:]
        res["sidecar_first_save_stall_s"] = stalls[0]
        res["sidecar_wait_s"] = waits[WARM:]
        res["replication_s"] = rep[WARM:]
    finally:
        a.stop()
        b.stop()
        cat.close()
    # run 2: persistence (world 1, L2 every step)
    job = f"bench-{uuid.uuid4().hex[:6]}"
    c_env = sidecar_env(job, 0, 1, "a", "127.0.0.1", workdir / "c", slot, redis_url, PEER_REPLICAS=0, PERSIST_EVERY=1,
                 PERSIST_URI="s3://bench-sidecar/ckpt", S3_ENDPOINT=minio.endpoint, S3_ACCESS_KEY=minio.access_key,
                 S3_SECRET_KEY=minio.secret_key)
    c = SidecarProcess(c_env, workdir / "c.log")
    cat = Catalog(redis_url, job, 1)
    plan1 = plan_shard(state, Layout(), 0, PatternRules([]))
    try:
        settings = TrainerSettings(job=job, rank=0, world_size=1, node="a", secret="bench-secret-0123456789",
                                   arena_dir=workdir / "c", slots=2, slot_bytes=slot)
        plain, uploads = PlainUpload(state, minio.endpoint, minio.access_key, minio.secret_key), []
        with SidecarClient(settings) as client:
            for step in range(reps + 1):
                client.save(step, state, plan1)
                wait(lambda s=step: "L2" in cat.holder_names(s, 0), 600, f"persistence of step {step}")
                uploads.append(plain())
        del plain
        res["plain_upload_s"] = uploads[1:]
        res["persist_s"] = [e["seconds"] for e in c.events("persisted")][1:]
    finally:
        c.stop()
        cat.close()
    return res
