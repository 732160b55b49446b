"""One row of ``lifeline bench reshard``: a change of tensor degree A -> B.

Save phase (untimed): A ``lifeline sidecar`` processes (one per rank of the old layout, each on its own
loopback address and node name, L1 replication to a peer, L2 persistence every step to MinIO) and A
gloo ranks that save their shard to their sidecar and, with torch.distributed.checkpoint (DTensor
``Shard(0)`` on a mesh of A), to the same MinIO. The row waits until the step is complete at L1 and
committed at L2.

Measure phase: B long-lived ranks of the new layout (:mod:`lifeline.bench._reshard_target`, one gloo
group of B formed once, the new shard's buffers allocated) load by each peer in turn, peers
interleaved with the order rotated every repeat. Before each run (untimed): the page cache of
MinIO's files is dropped and the buffers are filled with NaN. The clock starts when the start
command is written to the ranks and stops when the last rank finished the all_reduce that follows
its load.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from lifeline.bench._ckpt_common import drop_cache, interleaved
from lifeline.bench._reshard_source import COLS, RULES, StateSpec, layout_of
from lifeline.bench._reshard_target import TAG
from lifeline.bench._sidecar_peers import wait
from lifeline.bench._sidecar_runs import SidecarProcess, sidecar_env
from lifeline.catalog import Catalog
from lifeline.checkpoint import S3Storage, list_steps, plan_shard

__all__ = ["PEERS", "reshard_row"]

PEERS = ("memory", "l2", "dcp", "dcp_readahead")
SECRET = "bench-secret-0123456789"
STEP = 10
BUCKET = "bench-reshard"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (``/proc``); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Ranks:
    """The B processes of the new layout, driven over their stdin/stdout."""

    def __init__(self, cfgs: list[dict], logdir: Path) -> None:
        self.logs = [open(logdir / f"target-{c['rank']}.log", "wb") for c in cfgs]
        self.procs = [subprocess.Popen([sys.executable, "-m", "lifeline.bench._reshard_target", json.dumps(c)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
                      for c, log in zip(cfgs, self.logs)]
        self.replies("ready")

    def send(self, cmd: dict) -> None:
        line = json.dumps(cmd) + "\n"
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()

    def replies(self, op: str) -> list[dict]:
        out = []
        for p, log in zip(self.procs, self.logs):
            for line in p.stdout:
                if line.startswith(TAG):
                    msg = json.loads(line[len(TAG):])
                    if msg["op"] != op:
                        raise RuntimeError(f"reshard rank answered {msg['op']!r}, expected {op!r}")
                    out.append(msg)
                    break
            else:
                p.wait()
                raise RuntimeError(f"reshard rank exited with code {p.returncode}:\n"
                                   + Path(log.name).read_text(errors="replace")[-3000:])
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    p.stdin.close()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()


def _save_phase(spec: StateSpec, a: int, job: str, root: Path, arenas: Path, redis_url: str, minio: Any,
                sidecars: list[SidecarProcess]) -> dict[str, Any]:
    """Start A sidecars (appended to ``sidecars``), run A saving ranks, wait for L1 and L2; seconds taken."""
    t0 = time.perf_counter()
    local = {f"layers.{i}.weight": torch.empty(spec.rows // a, COLS) for i in range(spec.tensors)}
    slot = plan_shard(local, layout_of(a), 0, RULES).nbytes
    del local
    s3 = dict(PERSIST_EVERY=1, PERSIST_URI=f"s3://{BUCKET}/ours", S3_ENDPOINT=minio.endpoint,
              S3_ACCESS_KEY=minio.access_key, S3_SECRET_KEY=minio.secret_key)
    for r in range(a):
        env = sidecar_env(job, r, a, f"node-{r}", f"127.0.0.{r + 1}", arenas / f"rank-{r}", slot, redis_url,
                          PEER_REPLICAS=1 if a > 1 else 0, KEEP=1, **s3)
        sidecars.append(SidecarProcess(env, root / f"sidecar-{r}.log"))
    port = _free_port()
    procs = []
    for r in range(a):
        settings = dict(job=job, rank=r, world_size=a, node=f"node-{r}", secret=SECRET, slots=2, slot_bytes=slot,
                        arena_dir=str(arenas / f"rank-{r}"), connect_timeout_seconds=120)
        cfg = dict(rank=r, world=a, port=port, spec=spec.to_json(), step=STEP, dcp=f"lminio://{BUCKET}/dcp/{job}",
                   minio=[minio.endpoint, minio.access_key, minio.secret_key], settings=settings)
        log = open(root / f"source-{r}.log", "wb")
        procs.append((subprocess.Popen([sys.executable, "-m", "lifeline.bench._reshard_source", json.dumps(cfg)],
                                       stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        rc = p.wait(1800)
        log.close()
        if rc != 0:
            tail = Path(log.name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"saving rank exited with code {rc}:\n{tail}")
    saved = time.perf_counter() - t0
    catalog = Catalog(redis_url, job, a)
    storage = S3Storage(minio.endpoint, minio.access_key, minio.secret_key, BUCKET)
    try:
        wait(lambda: catalog.latest_complete_step() == STEP, 1800, f"step {STEP} complete at L1 ({job})")
        wait(lambda: STEP in list_steps(storage, "ours", job), 1800, f"step {STEP} committed at L2 ({job})")
        replicas = {r: sorted(catalog.holder_names(STEP, r)) for r in range(a)}
    finally:
        catalog.close()
    return {"ranks_saved_s": round(saved, 3), "complete_l1_and_l2_s": round(time.perf_counter() - t0, 3),
            "holders": replicas}


def _ratio(a: float, b: float) -> float | None:
    """``a / b``, or ``None`` when ``b`` is 0 (a tiny run's CPU time below the clock tick)."""
    return a / b if b > 0 else None


def _summary(runs: list[dict]) -> dict[str, Any]:
    """Medians of a peer's runs; bytes from the run that read the most."""
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    most = max(runs, key=lambda r: r["read_bytes"])
    cpu = {k: round(statistics.median(r["cpu_s"][k] for r in runs), 3) for k in most["cpu_s"]}
    out = {"resume_s": med("resume_s"), "load_s": med("load_s"), "needed_bytes": most["needed_bytes"],
           "read_bytes": most["read_bytes"], "read_over_needed": most["read_bytes"] / most["needed_bytes"],
           "cpu_s": {**cpu, "total": round(statistics.median(sum(r["cpu_s"].values()) for r in runs), 3)}}
    if "bytes_by_tier" in most:
        out["bytes_by_tier"] = most["bytes_by_tier"]
        out["l2_bytes_every_run"] = [r["bytes_by_tier"]["L2"] for r in runs]
    return out


class _Measure:
    """Runs of the peers on the new layout's ranks, with the CPU seconds of every process involved."""

    def __init__(self, ranks: _Ranks, job: str, pids: dict[str, list[int]], minio_data: Path) -> None:
        self.ranks, self.job, self.pids, self.minio_data = ranks, job, pids, minio_data
        self.runs: dict[str, list[dict]] = {p: [] for p in PEERS}

    def settle(self, peer: str, i: int) -> None:
        """Untimed, before every run: drop the page cache of MinIO's files, fill the new shards with NaN."""
        drop_cache(self.minio_data)
        self.ranks.send({"op": "prep"})
        self.ranks.replies("prepped")

    def once(self, peer: str, keep: bool = True, profile: bool = False) -> dict[str, Any]:
        """One run of ``peer`` on every rank: seconds from the start command to the last rank resumed."""
        cpu0 = {k: sum(_cpu(p) for p in v) for k, v in self.pids.items()}
        t0 = time.monotonic()
        self.ranks.send({"op": "go", "peer": peer, **({"profile": True} if profile else {})})
        done = self.ranks.replies("done")
        cpu = {k: round(sum(_cpu(p) for p in v) - cpu0[k], 3) for k, v in self.pids.items()}
        if not all(d["equal"] for d in done):
            raise RuntimeError(f"{peer}: a rank's new shard differs from the saved values ({self.job})")
        run = {"resume_s": max(d["t_resumed"] for d in done) - t0, "load_s": max(d["t_loaded"] for d in done) - t0,
               "needed_bytes": sum(d["needed_bytes"] for d in done),
               "read_bytes": sum(d["read_bytes"] for d in done), "cpu_s": cpu}
        if "bytes_by_tier" in done[0]:
            run["bytes_by_tier"] = {t: sum(d["bytes_by_tier"][t] for d in done) for t in ("L0", "L1", "L2")}
        if profile:
            run["profile_rank0"] = done[0].get("profile")
        if keep:
            self.runs[peer].append(run)
        return run


def _target_configs(spec: StateSpec, b: int, job: str, arenas: Path, redis_url: str, minio: Any) -> list[dict]:
    """The new layout's ranks: pod ``r`` on 127.0.0.(r+1) (kept pods share their old sidecar's address)."""
    port, cfgs = _free_port(), []
    for r in range(b):
        settings = dict(job=job, rank=r, world_size=b, node=f"node-{r}", secret=SECRET, pod_ip=f"127.0.0.{r + 1}",
                        redis_url=redis_url, persist_uri=f"s3://{BUCKET}/ours", s3_endpoint=minio.endpoint,
                        s3_access_key=minio.access_key, s3_secret_key=minio.secret_key,
                        arena_dir=str(arenas / f"new-{r}"), layout=layout_of(b).to_dict())
        cfgs.append(dict(rank=r, world=b, port=port, spec=spec.to_json(), step=STEP, dcp=f"lminio://{BUCKET}/dcp/{job}",
                         settings=settings, minio=[minio.endpoint, minio.access_key, minio.secret_key]))
    return cfgs


def reshard_row(spec: StateSpec, a: int, b: int, repeats: int, root: Path, arenas: Path, redis: Any, minio: Any,
                profile: bool = False) -> dict[str, Any]:
    """Measure the change of tensor degree ``a`` -> ``b`` (module docstring); returns the row's JSON.

    Raises:
        RuntimeError: a rank failed, or a loaded shard differs from the saved values.
        TimeoutError: the step was not complete at L1 and L2 within 30 minutes.
    """
    job = f"reshard-{a}to{b}-{uuid.uuid4().hex[:6]}"
    root.mkdir(parents=True, exist_ok=True)
    sidecars: list[SidecarProcess] = []
    ranks = None
    try:
        row: dict[str, Any] = {"change": f"tensor {a} -> {b}", "from_layout": layout_of(a).to_dict(),
                               "to_layout": layout_of(b).to_dict(), "job": job}
        row["save"] = _save_phase(spec, a, job, root, arenas, redis.url, minio, sidecars)
        ranks = _Ranks(_target_configs(spec, b, job, arenas, redis.url, minio), root)
        pids = {"ranks": [p.pid for p in ranks.procs], "sidecars": [s.p.pid for s in sidecars],
                "minio": [minio.pid], "redis": [redis.pid]}
        m = _Measure(ranks, job, pids, minio.state_dir / "data")
        row["warmup_s"] = {}
        for peer in PEERS:  # untimed: first use of each path in these processes (imports, connections)
            m.settle(peer, -1)
            row["warmup_s"][peer] = round(m.once(peer, keep=False)["resume_s"], 4)
        interleaved({p: (lambda i, p=p: m.once(p)["resume_s"]) for p in PEERS}, repeats, settle=m.settle,
                    row=row["change"])
        res = row["peers"] = {p: _summary(m.runs[p]) for p in PEERS}
        row["samples_resume_s"] = {p: [round(r["resume_s"], 4) for r in m.runs[p]] for p in PEERS}
        mem = res["memory"]["resume_s"]
        row["ratios"] = {"dcp_over_memory": res["dcp"]["resume_s"] / mem,
                         "dcp_over_l2": res["dcp"]["resume_s"] / res["l2"]["resume_s"],
                         "l2_over_memory": res["l2"]["resume_s"] / mem,
                         "dcp_readahead_over_memory": res["dcp_readahead"]["resume_s"] / mem}
        tot = {p: res[p]["cpu_s"]["total"] for p in PEERS}  # CPU seconds of every process involved
        row["cpu_ratios"] = {"dcp_over_memory": _ratio(tot["dcp"], tot["memory"]),
                             "dcp_over_l2": _ratio(tot["dcp"], tot["l2"]),
                             "l2_over_memory": _ratio(tot["l2"], tot["memory"])}
        if profile:  # one more run of each peer under cProfile on every rank (rank 0's top entries kept)
            row["profile_rank0"] = {}
            for peer in PEERS:
                m.settle(peer, -1)
                row["profile_rank0"][peer] = m.once(peer, keep=False, profile=True)["profile_rank0"]
        return row
    finally:
        if ranks is not None:
            ranks.stop()
        for s in sidecars:
            s.stop()
        _drop_objects(minio, job)
        shutil.rmtree(arenas, ignore_errors=True)


def _drop_objects(minio: Any, job: str) -> None:
    """Delete the row's objects from MinIO (both checkpoints), so the next row starts with the disk it had."""
    storage = S3Storage(minio.endpoint, minio.access_key, minio.secret_key, BUCKET)
    for prefix in (f"ours/{job}/", f"dcp/{job}/"):
        try:
            for key in storage.list(prefix):
                storage.delete(key)
        except Exception:  # noqa: BLE001 - cleanup is best effort; the bench's temp dir goes anyway
            pass
