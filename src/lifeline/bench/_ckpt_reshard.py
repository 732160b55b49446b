"""The checkpoint bench's reshard row: N gloo ranks save (ours and DCP, DTensor ``Shard(0)``), then each of
the M target ranks loads its new shard, ours vs DCP.

Run as ``python -m lifeline.bench._ckpt_reshard worker CONFIG_JSON`` for one saving rank.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from lifeline.bench._ckpt_common import GiB, make_state, timed
from lifeline.checkpoint import (FilesystemStorage, Layout, PatternRules, ShardMetadata, Sharded, commit, load,
                                 persist_shard, plan_shard, shard_state, write_shard)

__all__ = ["bench_reshard", "worker"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(argv: list[str]) -> None:
    """One gloo rank of the reshard row's source layout: saves its shard with DCP (DTensor) and ours.

    ``argv[0]`` is JSON: ``{"rank", "world", "port", "root", "bytes", "tensors"}``."""
    warnings.filterwarnings("ignore")
    cfg = json.loads(argv[0])
    rank, world = cfg["rank"], cfg["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = make_state(cfg["bytes"], cfg["tensors"])
    rules = PatternRules([("*", Sharded(0))])
    layout = Layout(tensor=world)
    storage = FilesystemStorage(cfg["root"] + "/ours", fsync=True)
    dt = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()}
    dcp.save(dt, checkpoint_id=cfg["root"] + "/dcp")
    local = shard_state(full, layout, rank, rules)
    plan = plan_shard(local, layout, rank, rules)
    buf = torch.empty(plan.nbytes, dtype=torch.uint8)
    write_shard(plan, local, buf)
    meta = persist_shard(storage, "", plan, buf, job="bench", step=1)
    metas = [None] * world
    dist.all_gather_object(metas, meta.to_json())
    if rank == 0:
        commit(storage, "", "bench", 1, layout, [ShardMetadata.from_json(m) for m in metas])
    dist.destroy_process_group()


def _run_ranks(world: int, cfg: dict) -> None:
    """Run :func:`worker` as ``world`` processes (ranks of one gloo group); RuntimeError if one fails."""
    port = _free_port()
    procs = []
    for r in range(world):
        arg = json.dumps({**cfg, "rank": r, "world": world, "port": port})
        procs.append(subprocess.Popen([sys.executable, "-m", "lifeline.bench._ckpt_reshard", "worker", arg],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failures = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            failures.append(out[-3000:])
    if failures:
        raise RuntimeError("reshard worker failed:\n" + failures[0])


def bench_reshard(root: Path, total: int, tensors: int, n: int, m: int, repeats: int) -> dict[str, Any]:
    """N gloo ranks save (ours and DCP); then every one of the M target ranks loads its new shard here.

    Loads run one target rank at a time in this process (DCP's DTensor targets get the
    rank's coordinates from torch's in-process ``fake`` process group, ``no_dist=True``), ours
    and DCP interleaved, so the figure is free of multi-process scheduling noise on small
    machines: ``*_load_s`` is the median over repeats of the summed load time of all M ranks.

    Args:
        root: directory for both checkpoints; ``total``: state size in bytes, in ``tensors`` tensors.
        n, m: ranks saving and ranks loading; ``repeats``: loads per rank and peer.

    Returns:
        ``{"from_ranks", "to_ranks", "bytes_loaded", "ours_load_s", "dcp_load_s", "ours_gibps", "dcp_gibps",
        "speedup_vs_dcp"}`` (seconds, GiB/s).

    Raises:
        RuntimeError: a saving rank failed; AssertionError: a loaded shard differs from the source.
    """
    _run_ranks(n, {"root": str(root), "bytes": total, "tensors": tensors, "role": "save"})
    full = make_state(total, tensors)
    rules = PatternRules([("*", Sharded(0))])
    layout = Layout(tensor=m)
    storage = FilesystemStorage(root / "ours", fsync=True)
    times: dict[str, list[float]] = {"ours": [0.0] * repeats, "dcp": [0.0] * repeats}
    read_bytes = 0
    for r in range(m):
        want = shard_state(full, layout, r, rules)
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=m)
        try:
            mesh = init_device_mesh("cpu", (m,))
            targets = {k: DTensor.from_local(torch.zeros_like(v), mesh, [Shard(0)], run_check=False)
                       for k, v in want.items()}
            into = {k: torch.zeros_like(v) for k, v in want.items()}
            for i in range(repeats):
                times["ours"][i] += timed(lambda: load(storage, "", "bench", 1, layout, r, rules, into, threads=4))
                times["dcp"][i] += timed(lambda: dcp.load(targets, checkpoint_id=str(root / "dcp"), no_dist=True))
            for k in want:
                if not torch.equal(into[k], want[k]) or not torch.equal(targets[k].to_local(), want[k]):
                    raise AssertionError(f"reshard result differs for {k} on rank {r}")
            read_bytes += sum(v.numel() * v.element_size() for v in want.values())
        finally:
            dist.destroy_process_group()
    ours, dcp_s = statistics.median(times["ours"]), statistics.median(times["dcp"])
    return {"from_ranks": n, "to_ranks": m, "bytes_loaded": read_bytes, "ours_load_s": ours, "dcp_load_s": dcp_s,
            "ours_gibps": read_bytes / GiB / ours, "dcp_gibps": read_bytes / GiB / dcp_s,
            "speedup_vs_dcp": dcp_s / ours}


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "worker":
        worker(sys.argv[2:])
