"""``lifeline bench checkpoint --model fsdp2``: the trainer's stall of a save of an FSDP2 state, against one
memcpy of that state and against ``torch.distributed.checkpoint.async_save``'s blocking time, in one run.

``world`` forked ranks (gloo, CPU) each build :func:`lifeline.bench._fsdp2_model.build` (a Llama-shaped
model ``fully_shard``-ed per block and whole, AdamW with its moments), take the state once (``get_state_dict``
through ``StatefulState``: the DTensors' local shards; ``state_s``, not in any ratio) and then, every
repeat, with the peers' order rotated and a barrier before each:

- ``memcpy``: libc ``memmove`` of every local tensor into one pre-faulted buffer, one thread (the floor);
- ``ours``: the trainer's part of a sidecar save, ``SidecarClient._write``: ``write_parallel`` of the
  planned shard into a pre-faulted, reused arena-sized buffer (the plan made once, as the client
  reuses it while shapes hold);
- ``dcp_async``: ``torch.distributed.checkpoint.async_save`` of the same state dict (DTensors) to a
  local directory: the seconds until it returns (``blocking``) and until its future is done (``total``).

Measured: every time above, per rank (median of ``repeats``). Not measured (not part of ``ours``): the
control-socket round trips of a sidecar save (``acquire``/``commit``, a few hundred µs on the sidecar
bench) and the sidecar's own sealing and replication, which run off the trainer's path.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

__all__ = ["DEFAULT_SHAPES", "bench_fsdp2"]

DEFAULT_SHAPES = {"dim": 512, "hidden": 2048, "layers": 2, "vocab": 8192}
"""16.8 M parameters: with AdamW's two moments 201 MB of float32, half of it per rank at world size 2."""


def _memcpy(tensors: list[torch.Tensor], dst: torch.Tensor) -> float:
    base, off = dst.data_ptr(), 0
    t0 = time.perf_counter()
    for t in tensors:
        n = t.numel() * t.element_size()
        ctypes.memmove(base + off, t.data_ptr(), n)
        off += n
    return time.perf_counter() - t0


def _rank(rank: int, world: int, root: str, repeats: int, shapes: dict[str, int]) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from lifeline.bench._fsdp2_model import _App, build
    from lifeline.checkpoint import Layout, plan_shard
    from lifeline.runtime import StatefulState
    from lifeline.sidecar.client import write_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    model, optim = build(0, **shapes)
    app = _App(model, optim)
    t0 = time.perf_counter()
    state = StatefulState({"app": app})
    values = state.values(1)
    state_s = time.perf_counter() - t0
    sd = app.state_dict()
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    plan = plan_shard(values, Layout(data=world), rank, state.rules)
    arena = torch.empty(plan.nbytes, dtype=torch.uint8)
    arena.fill_(1)  # fault every page in now, as a sidecar's arena is
    view = memoryview(arena.numpy())
    threads = max(1, min(torch.get_num_threads(), 4))  # SidecarClient._write's choice
    pool = ThreadPoolExecutor(threads - 1) if threads > 1 else None
    dst = torch.empty(nbytes, dtype=torch.uint8)
    dst.fill_(1)

    def ours() -> float:
        t = time.perf_counter()
        write_parallel(plan, values, view, pool, threads)
        return time.perf_counter() - t

    def dcp_async(i: int) -> tuple[float, float]:
        where = f"{root}/dcp-{i}"
        t = time.perf_counter()
        fut = dcp.async_save({"app": sd}, checkpoint_id=where)
        blocking = time.perf_counter() - t
        fut.result()
        total = time.perf_counter() - t
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)
        return blocking, total

    samples: dict[str, list[float]] = {"memcpy": [], "ours": [], "dcp_async_blocking": [], "dcp_async_total": []}
    peers = ["memcpy", "ours", "dcp_async"]
    for i in range(repeats + 1):  # repeat 0 warms every peer up (DCP's first save builds its plan cache)
        for name in peers[i % 3:] + peers[:i % 3]:
            dist.barrier()
            if name == "memcpy":
                got = {"memcpy": _memcpy(tensors, dst)}
            elif name == "ours":
                got = {"ours": ours()}
            else:
                b, t = dcp_async(i)
                got = {"dcp_async_blocking": b, "dcp_async_total": t}
            if i:
                for k, v in got.items():
                    samples[k].append(v)
    med = {k: statistics.median(v) for k, v in samples.items()}
    out = {"rank": rank, "state_bytes": nbytes, "blob_bytes": plan.nbytes, "state_s": round(state_s, 6),
           "median_s": {k: round(v, 6) for k, v in med.items()},
           "stall_over_memcpy": round(med["ours"] / med["memcpy"], 3),
           "stall_over_dcp_async_blocking": round(med["ours"] / med["dcp_async_blocking"], 4),
           "samples": {k: [round(x, 6) for x in v] for k, v in samples.items()}}
    Path(root, f"rank-{rank}.json").write_text(json.dumps(out))
    if pool is not None:
        pool.shutdown()
    dist.barrier()
    dist.destroy_process_group()


def bench_fsdp2(world: int = 2, repeats: int = 5, workdir: str | None = None,
                shapes: dict[str, int] | None = None) -> dict[str, Any]:
    """Run the FSDP2 row (module docstring) on ``world`` forked gloo ranks; returns the JSON-ready result.

    Args:
        world: ranks (each ``fully_shard``-s over all of them).
        repeats: timed repeats per peer (after one warm-up round); medians reported.
        workdir: parent of the temporary directory (DCP's files, the rendezvous file); removed after.
        shapes: :class:`~lifeline.bench._fsdp2_model.LlamaShapes` arguments (default :data:`DEFAULT_SHAPES`).

    Returns:
        ``{"benchmark": "checkpoint-fsdp2", "world", "repeats", "shapes", "ranks": [per rank: state and
        blob bytes, median seconds per peer, ratios, samples], "stall_over_memcpy",
        "stall_over_dcp_async_blocking"}``: the ratios of the slowest rank (a step waits for it).

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank failed.
    """
    import torch.multiprocessing as mp

    shapes = dict(DEFAULT_SHAPES if shapes is None else shapes)
    root = tempfile.mkdtemp(prefix="lifeline-bench-fsdp2-", dir=workdir)
    try:
        mp.start_processes(_rank, args=(world, root, repeats, shapes), nprocs=world, start_method="fork")
        ranks = [json.loads(Path(root, f"rank-{r}.json").read_text()) for r in range(world)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"benchmark": "checkpoint-fsdp2", "world": world, "repeats": repeats, "shapes": shapes,
            "torch": torch.__version__, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "measured": "per rank: memcpy, ours (write_parallel into an arena-sized buffer), DCP async_save "
                        "blocking and total; medians",
            "not_measured": "sidecar acquire/commit round trips; get_state_dict (state_s, in neither ratio)",
            "stall_over_memcpy": max(r["stall_over_memcpy"] for r in ranks),
            "stall_over_dcp_async_blocking": max(r["stall_over_dcp_async_blocking"] for r in ranks),
            "ranks": ranks}
