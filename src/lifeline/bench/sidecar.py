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

Figures are medians over ``--repeats`` repetitions, after warm-up (one save; two for the
stall/replication run, so that the receiving sidecar is in its steady state of two replica buffers
in rotation, as the raw TCP receiver reuses its one buffer); the warm-up samples are kept under
``raw``. Stalls in seconds, throughputs in bytes per second. ``load`` records the machine's load
average before and after the run (other work on the machine skews every peer alike, since peers
are interleaved). Real Redis and MinIO are started on loopback for the run.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from lifeline.bench._sidecar_runs import sidecar_runs
from lifeline.devcluster.services import MinioServer, RedisServer

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
    g = torch.Generator().manual_seed(0)
    n = nbytes // 4 // 8
    return {f"layers.{i}.weight": torch.empty(n, dtype=torch.float32).uniform_(generator=g) for i in range(8)}


def run_bench(sizes: list[int], reps: int = 3) -> dict[str, Any]:
    """Run every measurement for each size; returns the JSON-ready result (see module docstring).

    Args:
        sizes: state sizes in bytes (each a state of 8 float32 tensors).
        reps: measured repetitions per peer (medians reported; warm-up samples kept under ``raw``).

    Raises:
        TimeoutError: a sidecar did not replicate or persist a save within 600 s.
        ClusterError: Redis or MinIO did not start.
    """
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
            side = sidecar_runs(state, real, reps, base / f"s{nbytes}", disk, redis.url, minio)
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
