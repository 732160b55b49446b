"""``lifeline bench sidecar``: the sidecar's trainer stall, replication and persistence vs their peers.

One run, one JSON object on stdout. For each state size (default 256 MiB and 1 GiB of fp32
tensors) it measures, in the same run and *interleaved* (each repetition runs one of every peer,
back to back, so that all of them see the same machine load):

* trainer stall per save through the real sidecar (a separate process) vs (a) a plain memcpy of
  the same bytes into pre-faulted memory (the floor), (b) ``torch.save`` to local disk,
  (c) the blocking time of ``torch.distributed.checkpoint.async_save``, (d) DLRover's flash
  checkpoint ``save_checkpoint(..., StorageType.MEMORY)`` (in a subprocess stepped one save at a
  time; the reason is recorded when it cannot run);
* replication throughput (sidecar → peer sidecar on another loopback IP, the real protocol:
  HMAC-authenticated, crc32c-framed, verified before the acknowledgement) vs raw loopback TCP of
  the same bytes between two processes;
* persistence throughput (the sidecar's L2 upload straight from the arena) vs a plain parallel
  multipart upload of the same bytes with the minio client (same part size and parallelism).

Figures are medians over ``--reps`` repetitions, after warm-up (one save; two for the
stall/replication run, so that the receiving sidecar is in its steady state of two replica buffers
in rotation, as the raw TCP receiver reuses its one buffer); the warm-up samples are kept under
``raw``. Stalls in seconds, throughputs in bytes per second. ``load`` records the machine's load
average before and after the run (other work on the machine skews every peer alike, since peers
are interleaved). Real Redis and MinIO are started on loopback for the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from lifeline._poll import wait_for

__all__ = ["run_bench", "parse_size"]

_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    """``"256MiB"`` → 268435456. Raises ValueError for an unknown unit."""
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit in {text!r}; use B, KiB, MiB or GiB")
    return int(float(num) * _UNITS[unit])


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _make_state(nbytes: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    n = nbytes // 4 // 8
    return {f"layers.{i}.weight": torch.empty(n, dtype=torch.float32).uniform_(generator=g) for i in range(8)}


def _wait(cond, timeout: float, what: str):
    return wait_for(cond, timeout, f"bench: {what}")


# ------------------------------------------------------------------------------------ baselines
class _Memcpy:
    """The floor: libc ``memcpy`` (``ctypes.memmove``) of every tensor into one pre-faulted buffer.

    :meth:`parallel` copies the same bytes split over ``threads`` threads (``memmove`` releases the
    GIL): it shows whether this machine's memory bandwidth leaves room below the one-thread floor.
    """

    def __init__(self, state, threads: int = 2) -> None:
        import torch
        from concurrent.futures import ThreadPoolExecutor

        self.state = state
        self.dst = torch.empty(sum(t.numel() * t.element_size() for t in state.values()), dtype=torch.uint8)
        self.dst.fill_(1)  # fault every page in now
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads

    def __call__(self) -> float:
        import ctypes

        base = self.dst.data_ptr()
        t0 = time.perf_counter()
        off = 0
        for t in self.state.values():
            n = t.numel() * t.element_size()
            ctypes.memmove(base + off, t.data_ptr(), n)
            off += n
        return time.perf_counter() - t0

    def parallel(self) -> float:
        import ctypes

        jobs, off = [], self.dst.data_ptr()
        for t in self.state.values():
            n = t.numel() * t.element_size()
            step = -(-n // self.threads)
            jobs += [(off + i, t.data_ptr() + i, min(step, n - i)) for i in range(0, n, step)]
            off += n
        t0 = time.perf_counter()
        for f in [self.pool.submit(ctypes.memmove, *j) for j in jobs]:
            f.result()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.pool.shutdown()


class _TorchSave:
    """``torch.save`` of the state to a file on local disk; one call, one save (the file is removed after)."""

    def __init__(self, state, workdir: Path) -> None:
        self.state, self.path = state, workdir / "torch-save.pt"

    def __call__(self) -> float:
        import torch

        t0 = time.perf_counter()
        torch.save(self.state, self.path)
        took = time.perf_counter() - t0
        self.path.unlink()
        return took


class _DcpAsync:
    """``torch.distributed.checkpoint.async_save`` (world size 1, gloo); one call, one save:
    ``(blocking seconds, seconds until the save completed)``."""

    def __init__(self, state, workdir: Path) -> None:
        import torch.distributed as dist

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.state, self.dir = state, workdir / "dcp"

    def __call__(self) -> tuple[float, float]:
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        fut = dcp.async_save(dict(self.state), checkpoint_id=str(self.dir))
        t1 = time.perf_counter()
        fut.result()
        t2 = time.perf_counter()
        shutil.rmtree(self.dir, ignore_errors=True)
        return t1 - t0, t2 - t0

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


_DLROVER = textwrap.dedent("""
    import os, sys, time, torch
    import torch.distributed as dist
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType
    nbytes, workdir, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    n = nbytes // 4 // 8
    state = {f"layers.{i}.weight": torch.empty(n).uniform_(generator=g) for i in range(8)}
    ck = DdpCheckpointer(workdir)
    step = 0
    while True:  # one save per line on stdin (the first is the warm-up), its stall printed
        t0 = time.perf_counter()
        ck.save_checkpoint(step, state, os.path.join(workdir, f"ckpt-{step}.pt"), storage_type=StorageType.MEMORY)
        print(f"DLROVER_SAVE {time.perf_counter() - t0!r}", flush=True)
        step += 1
        if not sys.stdin.readline():
            os._exit(0)
""")


class _DLRover:
    """DLRover's flash checkpoint to memory in a subprocess, one save per call (so that it interleaves
    with the sidecar's saves). Standalone (no ``dlrover-run`` agent) its engine forks a saver process
    and connects to it at once, which can race (connection refused): the warm-up save is tried in up
    to 3 fresh processes. ``why`` says why it cannot run (then calls return None)."""

    def __init__(self, nbytes: int, workdir: Path) -> None:
        self.p: subprocess.Popen | None = None
        self.why = ""
        self.attempts = 0
        self.first_s: float | None = None
        self.before = {p.name for p in Path("/dev/shm").glob("ckpt_shm_*")}
        try:
            import dlrover  # noqa: F401
        except ImportError:
            self.why = "dlrover is not installed (pip install dlrover into the venv for this bench)"
            return
        for attempt in range(3):
            self.attempts = attempt + 1
            self.log = workdir / f"dlrover-try{attempt}.log"
            (workdir / f"dlrover-try{attempt}").mkdir(parents=True, exist_ok=True)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = dict(os.environ, LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", NODE_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            with open(self.log, "w") as fh:
                self.p = subprocess.Popen(
                    [sys.executable, "-c", _DLROVER, str(nbytes), str(workdir / f"dlrover-try{attempt}"), str(port)],
                    stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    text=True)
            first = self._next(0)
            if first is not None:
                self.first_s = first
                return
            self.why = f"exit {self.p.returncode}: {self.log.read_text(errors='replace')[-1500:]}"
            self._kill()

    def _saves(self) -> list[float]:
        return [float(line.split()[1]) for line in self.log.read_text(errors="replace").splitlines()
                if line.startswith("DLROVER_SAVE ")]

    def _next(self, done: int) -> float | None:
        try:
            _wait(lambda: self.p.poll() is not None or len(self._saves()) > done, 600, "DLRover flash checkpoint")
        except TimeoutError:
            return None
        saves = self._saves()
        return saves[done] if len(saves) > done else None

    @property
    def ran(self) -> bool:
        return self.first_s is not None

    def __call__(self) -> float | None:
        """One more save; its stall in seconds (None when DLRover does not run)."""
        if not self.ran or self.p is None or self.p.poll() is not None:
            return None
        done = len(self._saves())
        try:
            self.p.stdin.write("save\n")
            self.p.stdin.flush()
        except OSError:
            return None
        return self._next(done)

    def _kill(self) -> None:
        if self.p is not None:
            try:  # DLRover forks a saver process that outlives the trainer: kill the whole group
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
            self.p = None
        for shm in Path("/dev/shm").glob("ckpt_shm_*"):  # DLRover's shared memory outlives its killed saver
            if shm.name not in self.before:
                shm.unlink(missing_ok=True)

    def close(self) -> None:
        self._kill()


class _RawTcp:
    """Raw loopback TCP of the same bytes between two processes (127.0.0.1 → 127.0.0.2); one call, one send.

    ``blob`` is the state's bytes (the memcpy floor's destination buffer: no second copy of the state
    in memory), sent with one blocking ``sendall`` and received with ``recv_into`` into one reused buffer.
    """

    _RECV = textwrap.dedent("""
        import socket, sys
        n = int(sys.argv[1])
        ls = socket.socket(); ls.bind(("127.0.0.2", 0)); ls.listen(1)
        print(ls.getsockname()[1], flush=True)
        c, _ = ls.accept()
        buf = memoryview(bytearray(n))
        while True:
            got = 0
            while got < n:
                r = c.recv_into(buf[got:], n - got)
                if not r:
                    sys.exit(0)
                got += r
            c.sendall(b"k")
    """)

    def __init__(self, blob: memoryview) -> None:
        self.blob = memoryview(blob).cast("B")
        nbytes = len(self.blob)
        self.p = subprocess.Popen([sys.executable, "-c", self._RECV, str(nbytes)], stdout=subprocess.PIPE, text=True)
        port = int(self.p.stdout.readline())
        self.s = socket.create_connection(("127.0.0.2", port), source_address=("127.0.0.1", 0))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        self.s.sendall(self.blob)
        if self.s.recv(1) != b"k":
            raise RuntimeError("raw TCP receiver failed")
        return time.perf_counter() - t0

    def close(self) -> None:
        self.s.close()
        self.p.wait(30)


class _PlainUpload:
    """A plain parallel multipart upload of the same bytes with the minio client (same part size and
    parallelism as the sidecar's storage); one call, one upload."""

    def __init__(self, state, endpoint: str, access: str, secret: str) -> None:
        from minio import Minio

        from lifeline.checkpoint import S3Storage

        defaults = S3Storage("x:1", "a", "b", "c")  # the part size and parallelism the sidecar uses
        self.part, self.par = defaults.part_size, defaults.max_concurrency
        self.client = Minio(endpoint, access_key=access, secret_key=secret, secure=False)
        self.bucket = "bench-plain"
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)
        self.data = b"".join(t.numpy().tobytes() for t in state.values())

    def __call__(self) -> float:
        import io

        t0 = time.perf_counter()
        self.client.put_object(self.bucket, "plain.bin", io.BytesIO(self.data), len(self.data), part_size=self.part,
                               num_parallel_uploads=self.par)
        took = time.perf_counter() - t0
        self.client.remove_object(self.bucket, "plain.bin")
        return took


# ------------------------------------------------------------------------------------ the sidecar
class _Sidecar:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.fh = open(log, "wb")
        self.p = subprocess.Popen([sys.executable, "-m", "lifeline", "sidecar"], env=env, stdout=self.fh,
                                  stderr=subprocess.STDOUT, start_new_session=True)

    def events(self, name: str) -> list[dict[str, Any]]:
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
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.fh.close()


def _env(job: str, rank: int, world: int, node: str, ip: str, arena: Path, slot_bytes: int, redis_url: str,
         **extra: Any) -> dict[str, str]:
    env = dict(os.environ)
    base = dict(JOB=job, RANK=rank, WORLD_SIZE=world, NODE=node, POD_IP=ip, ARENA_DIR=arena, SLOTS=2,
                SLOT_BYTES=slot_bytes, REDIS_URL=redis_url, SECRET="bench-secret-0123456789", PEER_PORT=0,
                METRICS_PORT=-1, KEEP=1, HEARTBEAT_SECONDS=0.5, MEMORY_BYTES=4 * slot_bytes, PERSIST_EVERY=0,
                LOG_LEVEL="INFO")
    base.update({k.upper(): v for k, v in extra.items()})
    env.update({f"LIFELINE_{k}": str(v) for k, v in base.items()})
    return env


_WARM = 2  # warm-up saves: the receiver reaches its steady state (two replica buffers in rotation, faulted in)


def _sidecar_runs(state, nbytes: int, reps: int, workdir: Path, disk: Path, redis_url: str, minio) -> dict[str, Any]:
    from lifeline.api.pod import TrainerSettings
    from lifeline.checkpoint import Layout, PatternRules, plan_shard
    from lifeline.sidecar.catalog import Catalog
    from lifeline.sidecar.client import SidecarClient

    workdir.mkdir(parents=True, exist_ok=True)
    plan = plan_shard(state, Layout(data=2), 0, PatternRules([]))
    slot = plan.nbytes
    res: dict[str, Any] = {}
    # run 1: stall + replication (rank 0 on node a / 127.0.0.1 → rank 1 on node b / 127.0.0.2)
    job = f"bench-{uuid.uuid4().hex[:6]}"
    a_env = _env(job, 0, 2, "a", "127.0.0.1", workdir / "a", slot, redis_url, PEER_REPLICAS=1)
    b_env = _env(job, 1, 2, "b", "127.0.0.2", workdir / "b", 1 << 20, redis_url, PEER_REPLICAS=1,
                 MEMORY_BYTES=3 * slot)
    a, b = _Sidecar(a_env, workdir / "a.log"), _Sidecar(b_env, workdir / "b.log")
    cat = Catalog(redis_url, job, 2)
    try:
        settings = TrainerSettings(**{k[9:].lower(): v for k, v in a_env.items() if k.startswith("LIFELINE_")
                                      and k[9:] in ("JOB", "RANK", "WORLD_SIZE", "NODE", "SECRET", "ARENA_DIR",
                                                    "SLOTS", "SLOT_BYTES")})
        tsave, dcp = _TorchSave(state, disk), _DcpAsync(state, disk)
        dl = _DLRover(nbytes, disk)
        memcpy = _Memcpy(state)
        memcpy()  # the destination now holds the state's bytes: the raw TCP peer sends those
        tcp = _RawTcp(memoryview(memcpy.dst.numpy()))
        try:
            with SidecarClient(settings) as client:
                stalls, waits, floor, floor2, raw, saves, dcps, dls = [], [], [], [], [], [], [], []
                for step in range(reps + _WARM):  # peers interleaved with the sidecar: both see the same load
                    floor.append(memcpy())
                    floor2.append(memcpy.parallel())
                    r = client.save(step, state, plan)
                    stalls.append(r.stall_seconds)
                    waits.append(r.waited_seconds)
                    _wait(lambda s=step: "L1@1" in cat.holders(s, 0), 600, f"replication of step {step}")
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
        res["warmup"] = {"raw_tcp_s": raw[:_WARM], "replication_s": rep[:_WARM], "sidecar_stall_s": stalls[:_WARM],
                         "torch_save_s": saves[:_WARM], "dcp_blocking_s": [x[0] for x in dcps[:_WARM]]}
        res["raw_tcp_s"] = raw[_WARM:]
        res["torch_save_s"] = saves[_WARM:]
        res["dlrover"] = ({"ran": True, "stall_s": dls[_WARM:], "warmup_s": [dl.first_s, *dls[:_WARM]],
                           "attempts": dl.attempts} if dl.ran and None not in dls else
                          {"ran": False, "why": dl.why or f"a save failed: {dl.log.read_text(errors='replace')[-1500:]}"})
        res["dcp"] = {"blocking_s": [x[0] for x in dcps[_WARM:]], "complete_s": [x[1] for x in dcps[_WARM:]]}
        res["memcpy_s"] = floor[_WARM:]
        res["memcpy_parallel_s"] = floor2[_WARM:]
        res["sidecar_stall_s"] = stalls[_WARM:]
        res["sidecar_first_save_stall_s"] = stalls[0]
        res["sidecar_wait_s"] = waits[_WARM:]
        res["replication_s"] = rep[_WARM:]
    finally:
        a.stop()
        b.stop()
        cat.close()
    # run 2: persistence (world 1, L2 every step)
    job = f"bench-{uuid.uuid4().hex[:6]}"
    c_env = _env(job, 0, 1, "a", "127.0.0.1", workdir / "c", slot, redis_url, PEER_REPLICAS=0, PERSIST_EVERY=1,
                 PERSIST_URI="s3://bench-sidecar/ckpt", S3_ENDPOINT=minio.endpoint, S3_ACCESS_KEY=minio.access_key,
                 S3_SECRET_KEY=minio.secret_key)
    c = _Sidecar(c_env, workdir / "c.log")
    cat = Catalog(redis_url, job, 1)
    plan1 = plan_shard(state, Layout(), 0, PatternRules([]))
    try:
        settings = TrainerSettings(job=job, rank=0, world_size=1, node="a", secret="bench-secret-0123456789",
                                   arena_dir=workdir / "c", slots=2, slot_bytes=slot)
        plain, uploads = _PlainUpload(state, minio.endpoint, minio.access_key, minio.secret_key), []
        with SidecarClient(settings) as client:
            for step in range(reps + 1):
                client.save(step, state, plan1)
                _wait(lambda s=step: "L2" in cat.holders(s, 0), 600, f"persistence of step {step}")
                uploads.append(plain())
        del plain
        res["plain_upload_s"] = uploads[1:]
        res["persist_s"] = [e["seconds"] for e in c.events("persisted")][1:]
    finally:
        c.stop()
        cat.close()
    return res


def run_bench(sizes: list[int], reps: int = 3) -> dict[str, Any]:
    """Run every measurement for each size; returns the JSON-ready result (see module docstring)."""
    import torch

    from lifeline.devcluster.services import MinioServer, RedisServer

    torch.manual_seed(0)
    out: dict[str, Any] = {
        "bench": "sidecar", "reps": reps, "torch": torch.__version__, "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "sizes": {}, "load": {"before": os.getloadavg()},
        "targets": {"stall_vs_memcpy_max": 1.3, "torch_save_vs_stall_min": 10.0, "replication_vs_tcp_min": 0.8,
                    "persist_vs_plain_min": 0.9},
    }
    base = Path(tempfile.mkdtemp(prefix="lifeline-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    disk = Path(tempfile.mkdtemp(prefix="lifeline-bench-disk-", dir=os.environ.get("LIFELINE_BENCH_DISK", "/var/tmp")))
    redis, minio = RedisServer().start(), MinioServer().start()
    try:
        for nbytes in sizes:
            state = _make_state(nbytes)
            real = sum(t.numel() * 4 for t in state.values())
            r: dict[str, Any] = {"bytes": real}
            side = _sidecar_runs(state, real, reps, base / f"s{nbytes}", disk, redis.url, minio)
            tsave, dcp, dl = side.pop("torch_save_s"), side.pop("dcp"), side.pop("dlrover")
            shutil.rmtree(base / f"s{nbytes}", ignore_errors=True)
            memcpy = side["memcpy_s"]
            tcp, plain = side["raw_tcp_s"], side["plain_upload_s"]
            stall = _median(side["sidecar_stall_s"])
            r["stall_s"] = {
                "sidecar": stall, "sidecar_min": min(side["sidecar_stall_s"]), "memcpy_min": min(memcpy),
                "sidecar_backpressure_wait": _median(side["sidecar_wait_s"]),
                "sidecar_first_save": side["sidecar_first_save_stall_s"], "memcpy": _median(memcpy),
                "memcpy_2_threads": _median(side["memcpy_parallel_s"]),
                "torch_save": _median(tsave), "dcp_async_save_blocking": _median(dcp["blocking_s"]),
                "dcp_async_save_complete": _median(dcp["complete_s"]),
                "dlrover_flash_memory": _median(dl["stall_s"]) if dl.get("ran") else None,
            }
            if not dl.get("ran"):
                r["dlrover_why_not"] = dl.get("why")
            r["throughput_Bps"] = {
                "replication": real / _median(side["replication_s"]), "raw_tcp": real / _median(tcp),
                "persistence": real / _median(side["persist_s"]), "plain_multipart_upload": real / _median(plain),
            }
            st, tp = r["stall_s"], r["throughput_Bps"]
            r["ratios"] = {
                "stall_vs_memcpy": stall / st["memcpy"],
                "torch_save_vs_stall": st["torch_save"] / stall,
                "torch_save_vs_memcpy": st["torch_save"] / st["memcpy"],  # the most any one-memcpy stall can reach
                "torch_save_vs_fastest_memcpy": st["torch_save"] / min(st["memcpy"], st["memcpy_2_threads"]),
                "dcp_blocking_vs_stall": st["dcp_async_save_blocking"] / stall,
                "dlrover_vs_stall": (st["dlrover_flash_memory"] / stall) if st["dlrover_flash_memory"] else None,
                "replication_vs_tcp": tp["replication"] / tp["raw_tcp"],
                "persist_vs_plain": tp["persistence"] / tp["plain_multipart_upload"],
            }
            rt = r["ratios"]
            r["targets_met"] = {
                "stall_vs_memcpy": rt["stall_vs_memcpy"] <= 1.3,
                "torch_save_vs_stall": rt["torch_save_vs_stall"] >= 10.0,
                "dcp_blocking_vs_stall": rt["dcp_blocking_vs_stall"] > 1.0,
                "dlrover_vs_stall": None if rt["dlrover_vs_stall"] is None else rt["dlrover_vs_stall"] > 1.0,
                "replication_vs_tcp": rt["replication_vs_tcp"] >= 0.8,
                "persist_vs_plain": rt["persist_vs_plain"] >= 0.9,
            }
            r["raw"] = {"torch_save_s": tsave, "dcp": dcp, "sidecar": side, "dlrover": dl}
            out["sizes"][str(nbytes)] = r
            del state
    finally:
        minio.stop()
        redis.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    out["load"]["after"] = os.getloadavg()
    return out
