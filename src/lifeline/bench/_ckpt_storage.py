"""The checkpoint bench's storage rows: ours vs DCP vs ``torch.save`` vs the storage's raw throughput,
on the filesystem and on MinIO (see :mod:`lifeline.bench.checkpoint`)."""

from __future__ import annotations

import io
import mmap
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from lifeline.bench._ckpt_common import (CPU, GiB, check_equal, drop_cache, fsync_path, interleaved, nbytes, timed,
                                         warm)
from lifeline.bench._dcp_s3 import register
from lifeline.checkpoint import (FilesystemStorage, Layout, PatternRules, S3Storage, commit, load, persist_shard,
                                 persist_state, plan_shard, write_shard)
from lifeline.devcluster.services import MinioServer

__all__ = ["Ours", "bench_filesystem", "bench_minio", "rates", "FS_CONDITIONS", "FS_DURABILITY"]


class Ours:
    """Our save (plan once, write_shard into a reused buffer, seal, put, commit) and verified load."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.layout, self.rules = Layout(), PatternRules()
        self.plan = plan_shard(state, self.layout, 0, self.rules)
        # like a sidecar arena slot: page-aligned (an mmap), allocated and faulted in once
        self.arena = mmap.mmap(-1, self.plan.nbytes)
        self.buf = torch.frombuffer(self.arena, dtype=torch.uint8)
        self.buf.fill_(0)

    def save(self, storage: Any, prefix: str, step: int, state: dict) -> None:
        """Direct save (``persist_state``): gather write from the tensors, checksummed in parallel."""
        meta = persist_state(storage, prefix, self.plan, state, job="bench", step=step)
        commit(storage, prefix, "bench", step, self.layout, [meta])

    def stage(self, state: dict) -> None:
        """The trainer's part of the sidecar path: ``write_shard`` (one memcpy) into the arena slot."""
        write_shard(self.plan, state, self.buf)

    def save_staged(self, storage: Any, prefix: str, step: int) -> None:
        """The sidecar's part: seal and persist the blob already in the arena slot (``persist_shard``), commit."""
        meta = persist_shard(storage, prefix, self.plan, self.buf, job="bench", step=step)
        commit(storage, prefix, "bench", step, self.layout, [meta])

    def load(self, storage: Any, prefix: str, step: int, into: dict) -> None:
        """Verified load of ``step`` into the tensors of ``into`` (4 reader threads)."""
        load(storage, prefix, "bench", step, self.layout, 0, self.rules, into, threads=4)


def bench_filesystem(state: dict, root: Path, repeats: int) -> dict[str, Any]:
    """The filesystem rows under ``root``: save and load of every peer, each ``repeats`` times, interleaved
    (see :data:`FS_CONDITIONS`, :data:`FS_DURABILITY`). Returns ``{peer: {"save_s", "save_gibps", ...},
    "ratios", "cpu_ratios", "durability", "conditions"}`` (seconds, GiB/s). Raises AssertionError when
    our round trip changes a tensor."""
    n = nbytes(state)
    ours = Ours(state)
    storage = FilesystemStorage(root / "ours", fsync=True)
    volatile = FilesystemStorage(root / "nofsync", fsync=False)
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    blob = ours.buf.numpy()
    raw_buf = bytearray(n)
    res: dict[str, dict[str, float]] = {k: {} for k in ("ours", "ours_staged", "dcp", "torch", "raw", "ours_nofsync",
                                                         "ours_staged_nofsync", "dcp_nofsync", "torch_nofsync",
                                                         "raw_nofsync")}

    def dcp_path(i: int) -> str:
        return str(root / f"dcp-{i}")

    def torch_path(i: int) -> str:
        return str(root / f"torch-{i}.pt")

    stage_times: list[float] = []

    def staged(store: Any, i: int) -> float:
        return timed(lambda: ours.save_staged(store, "staged", i))

    saves = {
        "ours": lambda i: timed(lambda: ours.save(storage, "", i, state)),
        "ours_staged": lambda i: staged(storage, i),
        "dcp": lambda i: timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(dcp_path(i)), no_dist=True)),
        "torch": lambda i: timed(lambda: (torch.save(state, torch_path(i)), fsync_path(torch_path(i)))),
        "raw": lambda i: timed(lambda: storage.put(f"raw/{i}.bin", memoryview(blob)[:n])),
        # the same peers leaving durability to the page cache (no fsync anywhere): CPU cost alone
        "ours_nofsync": lambda i: timed(lambda: ours.save(volatile, "", i, state)),
        "ours_staged_nofsync": lambda i: staged(volatile, i),
        "dcp_nofsync": lambda i: timed(lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(dcp_path(i) + "-nofsync", sync_files=False), no_dist=True)),
        "torch_nofsync": lambda i: timed(lambda: torch.save(state, torch_path(i) + ".nofsync")),
        "raw_nofsync": lambda i: timed(lambda: volatile.put(f"raw/{i}.bin", memoryview(blob)[:n])),
    }
    async_total: list[float] = []

    def async_save(i: int) -> float:
        t0 = time.perf_counter()
        fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(str(root / f"dcp-async-{i}")), no_dist=True)
        blocked = time.perf_counter() - t0
        (fut.result() if hasattr(fut, "result") else fut.upload_completion.result())
        async_total.append(time.perf_counter() - t0)
        return blocked

    def cold(name: str, i: int) -> None:
        if name.startswith("ours_staged"):  # the trainer's memcpy into the slot: timed apart, not in the row
            stage_times.append(timed(lambda: ours.stage(state)))
        drop_cache(root)

    medians = interleaved({**saves, "dcp_async": async_save}, repeats, settle=cold, row="fs_save")
    for name in saves:
        res[name]["save_s"] = medians[name]
    res["dcp"]["async_save_block_s"] = medians["dcp_async"]
    res["dcp"]["async_save_total_s"] = statistics.median(async_total)
    res["ours_staged"]["stage_s"] = statistics.median(stage_times)

    loads = {
        "ours": lambda i: timed(lambda: ours.load(storage, "", i, into)),
        "dcp": lambda i: timed(lambda: dcp.load(into, storage_reader=dcp.FileSystemReader(dcp_path(i)), no_dist=True)),
        "torch": lambda i: timed(lambda: torch.load(torch_path(i), weights_only=True)),
        "raw": lambda i: timed(lambda: storage.get_into(f"raw/{i}.bin", 0, raw_buf)),
    }
    files = {"ours": lambda i: [str(root / "ours" / "bench" / f"{i:012d}")], "dcp": lambda i: [dcp_path(i)],
             "torch": lambda i: [torch_path(i)], "raw": lambda i: [str(root / "ours" / "raw" / f"{i}.bin")]}
    for name, t in interleaved(loads, repeats, settle=cold, row="fs_load").items():
        res[name]["load_s"] = t
    hot = lambda name, i: (drop_cache(root), warm(files[name](i)))  # noqa: E731
    for name, t in interleaved(loads, repeats, settle=hot, row="fs_load_hot").items():
        res[name]["load_hot_s"] = t
    for name in res:
        for op, row in (("save", "fs_save"), ("load", "fs_load"), ("load_hot", "fs_load_hot")):
            if f"{row}/{name}" in CPU:
                res[name][f"{op}_cpu_s"] = CPU[f"{row}/{name}"]
    ours.load(storage, "", 0, into)
    check_equal(state, into, "ours/filesystem")
    out = rates(res, n)
    out["durability"] = FS_DURABILITY
    out["conditions"] = FS_CONDITIONS
    return out


def bench_minio(state: dict, root: Path, repeats: int) -> dict[str, Any]:
    """The MinIO rows: a MinIO server started under ``root/minio``; save and load of every peer, each
    ``repeats`` times, interleaved. Returns ``{peer: {"save_s", "save_gibps", ...}, "ratios"}`` (seconds,
    GiB/s). Raises AssertionError when our round trip changes a tensor, ClusterError when MinIO fails."""
    n = nbytes(state)
    with MinioServer(state_dir=root / "minio") as server:
        storage = S3Storage(server.endpoint, server.access_key, server.secret_key, "bench", max_concurrency=8)
        storage.put("probe", b"x")
        register(server.endpoint, server.access_key, server.secret_key)
        ours = Ours(state)
        into = {k: torch.zeros_like(v) for k, v in state.items()}
        blob = ours.buf.numpy()
        raw_buf = bytearray(n)
        res: dict[str, dict[str, float]] = {"ours": {}, "ours_staged": {}, "dcp": {}, "torch": {}, "raw": {}}

        def torch_save(i: int) -> None:
            buf = io.BytesIO()
            torch.save(state, buf)
            storage.put(f"torch/{i}.pt", buf.getbuffer())

        saves = {
            "ours": lambda i: timed(lambda: ours.save(storage, "ours", i, state)),
            "ours_staged": lambda i: (ours.stage(state), timed(lambda: ours.save_staged(storage, "staged", i)))[1],
            "dcp": lambda i: timed(lambda: dcp.save(
                state, storage_writer=dcp.FsspecWriter(f"lminio://bench/dcp-{i}", sync_files=False), no_dist=True)),
            "torch": lambda i: timed(lambda: torch_save(i)),
            "raw": lambda i: timed(lambda: storage.put(f"raw/{i}.bin", memoryview(blob)[:n])),
        }
        async_total: list[float] = []

        def async_save(i: int) -> float:
            t0 = time.perf_counter()
            fut = dcp.async_save(state, storage_writer=dcp.FsspecWriter(f"lminio://bench/dcp-async-{i}", sync_files=False),
                                 no_dist=True)
            blocked = time.perf_counter() - t0
            (fut.result() if hasattr(fut, "result") else fut.upload_completion.result())
            async_total.append(time.perf_counter() - t0)
            return blocked

        cold = lambda name, i: drop_cache(root / "minio")  # noqa: E731
        medians = interleaved({**saves, "dcp_async": async_save}, repeats, settle=cold, row="minio_save")
        for name in saves:
            res[name]["save_s"] = medians[name]
        res["dcp"]["async_save_block_s"] = medians["dcp_async"]
        res["dcp"]["async_save_total_s"] = statistics.median(async_total)

        def torch_load(i: int) -> None:
            torch.load(io.BytesIO(storage.get(f"torch/{i}.pt")), weights_only=True)

        loads = {
            "ours": lambda i: timed(lambda: ours.load(storage, "ours", i, into)),
            "dcp": lambda i: timed(lambda: dcp.load(into, storage_reader=dcp.FsspecReader(f"lminio://bench/dcp-{i}"),
                                                     no_dist=True)),
            "torch": lambda i: timed(lambda: torch_load(i)),
            "raw": lambda i: timed(lambda: storage.get_into(f"raw/{i}.bin", 0, raw_buf)),
        }
        for name, t in interleaved(loads, repeats, settle=cold, row="minio_load").items():
            res[name]["load_s"] = t
        ours.load(storage, "ours", 0, into)
        check_equal(state, into, "ours/minio")
    return rates(res, n)


FS_CONDITIONS = {
    "order": "peers interleaved, order rotated every repeat; the median of the repeats is reported",
    "before_every_save": "os.sync, then posix_fadvise(DONTNEED) of every bench file: same (empty) page cache of "
                         "bench files for every peer",
    "load_s": "cold: os.sync + DONTNEED of every bench file before every load (a restore on a new node)",
    "load_hot_s": "hot: caches dropped, then the peer's own files read once before its load",
    "ours_staged": "save_s times persist_shard + commit of a blob already in a page-aligned (arena-like) buffer: "
                   "the sidecar's work; stage_s is the trainer's write_shard memcpy into it, measured apart",
    "*_cpu_s": "median CPU seconds (user + system, all threads of this process) of the same operations; "
               "wall times on a shared machine stretch with its load, CPU seconds much less",
    "minio": "the same interleaving; caches of the MinIO server's files dropped before every save and load",
}
"""How the filesystem rows are measured (the same for every peer)."""

FS_DURABILITY = {
    "ours": "fsync of the blob and of the manifest (temp file, fsync, rename, fsync of the directory); the blob "
            "written with O_DIRECT (FilesystemStorage direct=True, the default with fsync)",
    "ours_staged": "as ours",
    "dcp": "FileSystemWriter(sync_files=True), DCP's default: fsync of the data file and of .metadata",
    "torch": "torch.save, then fsync of the file",
    "raw": "FilesystemStorage.put of one object: temp file, O_DIRECT write, fsync, rename, fsync of the directory",
    "*_nofsync": "the same writes without any fsync and through the page cache (FilesystemStorage fsync=False: "
                 "no O_DIRECT): each peer's CPU cost",
}
"""What each filesystem row makes durable before its save returns (peers compared like with like)."""


def rates(res: dict[str, dict[str, float]], n: int) -> dict[str, Any]:
    """Add GiB/s beside every ``save_s``/``load_s`` of ``res`` (``n`` bytes each), then ``ratios`` and
    ``cpu_ratios`` (ours against every peer); returns ``res``."""
    for row in res.values():
        for key in ("save", "load"):
            if f"{key}_s" in row:
                row[f"{key}_gibps"] = n / GiB / row[f"{key}_s"]
    o, d, t, r = res["ours"], res["dcp"], res["torch"], res["raw"]
    res["ratios"] = {
        "save_vs_dcp": o["save_gibps"] / d["save_gibps"],
        "staged_save_vs_dcp": res["ours_staged"]["save_gibps"] / d["save_gibps"],
        "save_vs_dcp_async_total": d["async_save_total_s"] / o["save_s"],
        "save_vs_torch": o["save_gibps"] / t["save_gibps"],
        "save_vs_raw": o["save_gibps"] / r["save_gibps"],
        "load_vs_dcp": o["load_gibps"] / d["load_gibps"],
        "load_vs_torch": o["load_gibps"] / t["load_gibps"],
        "load_vs_raw": o["load_gibps"] / r["load_gibps"],
        **({"load_hot_vs_dcp": d["load_hot_s"] / o["load_hot_s"],
            "load_hot_vs_torch": t["load_hot_s"] / o["load_hot_s"],
            "load_hot_vs_raw": r["load_hot_s"] / o["load_hot_s"]} if "load_hot_s" in o else {}),
        "staged_save_vs_raw": res["ours_staged"]["save_gibps"] / r["save_gibps"],
    }
    if "save_cpu_s" in o:  # CPU seconds of this process per operation: peer's CPU / ours (>= 1: ours is cheaper)
        res["cpu_ratios"] = {f"{op}_{peer}_over_ours": res[peer][f"{op}_cpu_s"] / o[f"{op}_cpu_s"]
                             for op in ("save", "load", "load_hot") for peer in ("dcp", "torch", "raw")
                             if f"{op}_cpu_s" in res[peer] and o.get(f"{op}_cpu_s")}
        res["cpu_ratios"]["save_raw_over_staged"] = r["save_cpu_s"] / res["ours_staged"]["save_cpu_s"]
    if "ours_nofsync" in res:
        on, sn, dn, rn = (res[k]["save_gibps"] for k in ("ours_nofsync", "ours_staged_nofsync", "dcp_nofsync",
                                                            "raw_nofsync"))
        res["ratios"].update({"nofsync_save_vs_dcp": on / dn, "nofsync_staged_save_vs_dcp": sn / dn,
                              "nofsync_save_vs_raw": on / rn, "nofsync_staged_save_vs_raw": sn / rn})
    return res
