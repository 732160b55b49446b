"""The health check a node runs before a job uses it (docs/health.md): compute, then collective.

``python -m lifeline.runtime.health --index I --nodes a,b,c --pairs 0:1,1:2,2:0 --master HOST:PORT
--out FILE`` is one node's check, one process per node, all started together:

* **join** — the nodes join one gloo group (a TCP store at ``--master``, hosted by index 0), so that
  no node times its compute while others still start up.
* **compute** — a fixed fp32 matmul chain (seeded ``size × size`` matrix, ``chain`` products, one
  thread), best of ``repeats``: the sha256 of the result (equal on every healthy node: the same code
  on the same inputs) and the best CPU time of the thread, seconds. ``--exclusive LOCK`` takes an ``flock`` on ``LOCK``
  around it, for nodes that share one machine's cores (``lifeline run``): they take turns.
* **collective** — each pair of neighbouring nodes (``--pairs``, the launcher's
  :func:`lifeline.control.health.pairs`, one pair at a time) times an all-reduce of ``nbytes`` bytes,
  ``repeats`` times: bytes per second of the fastest, per partner.

The result is written to ``--out`` as JSON (``digest``, ``compute_seconds``, ``pair_bandwidth``), and
the launcher judges the nodes together (:func:`lifeline.control.health.judge`).

Faults for tests (:data:`HEALTH_FAULT_ENV`, set by ``lifeline run --unhealthy-node NODE:KIND``):
``compute`` flips the low bit of one element of the result (a device that computes wrongly), ``slow``
does each timed chain :data:`SLOW_FACTOR` times (a slow device), ``network`` sleeps
:data:`NETWORK_DELAY` seconds before each of its all-reduces (a slow link: its partner waits).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["HEALTH_FAULT_ENV", "HEALTH_FAULTS", "SLOW_FACTOR", "NETWORK_DELAY", "compute_check", "collective_check",
           "main"]

HEALTH_FAULT_ENV = "LIFELINE_FAULT_HEALTH"
"""This node's injected health fault (same name in :mod:`lifeline.launch._health`)."""
HEALTH_FAULTS = ("compute", "slow", "network")
SLOW_FACTOR = 4
"""A ``slow`` node does its chain this many times."""
NETWORK_DELAY = 0.1
"""Seconds a ``network`` node waits before each of its all-reduces."""


@contextmanager
def _exclusive(lock: Path | None):
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compute_check(*, size: int = 512, chain: int = 4, repeats: int = 10, seed: int = 20261129,
                  fault: str | None = None) -> tuple[str, float]:
    """``(sha256 hex of the result, best seconds)`` of ``chain`` products of a seeded ``size × size``
    fp32 matrix (scaled by ``1/sqrt(size)`` so the values stay finite), on one thread.

    The time is the thread's CPU time (``time.thread_time``), best of ``repeats``: a slow device
    takes more cycles for the same work, while a busy machine (other processes on its cores: the
    nodes of ``lifeline run`` share this machine's) only stretches the wall time. A ``slow`` fault
    does the work :data:`SLOW_FACTOR` times (real cycles, not a sleep).
    """
    torch.set_num_threads(1)
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(seed)) / size ** 0.5
    best, out = float("inf"), a
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(int(SLOW_FACTOR) if fault == "slow" else 1):
            out = a
            for _ in range(chain):
                out = out @ a
        best = min(best, time.thread_time() - start)
    data = bytearray(out.numpy().tobytes())
    if fault == "compute":
        data[0] ^= 1
    return hashlib.sha256(bytes(data)).hexdigest(), best


def _join(index: int, world: int, master: str, timeout: float) -> None:
    host, port = master.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=index == 0, timeout=timedelta(seconds=timeout))
    dist.init_process_group("gloo", store=store, rank=index, world_size=world, timeout=timedelta(seconds=timeout))


def collective_check(index: int, nodes: list[str], order: list[tuple[int, int]], *, nbytes: int = 4 << 20,
                     repeats: int = 8, fault: str | None = None) -> dict[str, float]:
    """``{partner node: bytes per second}`` of this node's all-reduces with its partners in ``order``
    (pairs of indices into ``nodes``, run one after the other), in the default process group (every
    node has joined it). Algorithm bandwidth of the fastest of ``repeats`` all-reduces: ``nbytes`` ÷
    its wall time (the best one: a busy machine slows some, a slow link every one)."""
    out = {}
    groups = [dist.new_group([a, b]) for a, b in order]
    x = torch.ones(nbytes // 4)
    for (a, b), group in zip(order, groups):
        if index in (a, b):
            dist.all_reduce(x, group=group)  # warm-up: connections
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                if fault == "network":
                    time.sleep(NETWORK_DELAY)
                dist.all_reduce(x, group=group)
                best = min(best, time.perf_counter() - start)
            out[nodes[b if index == a else a]] = nbytes / best
        dist.barrier()  # one pair at a time
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one node's check and write its JSON report; returns 0 (a check that raised exits non-zero)."""
    p = argparse.ArgumentParser(prog="python -m lifeline.runtime.health")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--nodes", required=True, help="comma-separated node names, the pairs' order")
    p.add_argument("--pairs", default="", help="comma-separated I:J index pairs, timed in this order")
    p.add_argument("--master", required=True, help="HOST:PORT of the TCP store (index 0 hosts it)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--exclusive", type=Path, default=None, help="lock file: compute checks take turns")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the nodes to join their group")
    args = p.parse_args(argv)
    fault = os.environ.get(HEALTH_FAULT_ENV) or None
    nodes = args.nodes.split(",")
    order = [(int(a), int(b)) for a, b in (x.split(":") for x in args.pairs.split(",") if x)]
    group = len(nodes) > 1
    if group:  # every node has started (imported torch: seconds of CPU) before any compute is timed
        _join(args.index, len(nodes), args.master, args.timeout)
        dist.barrier()
    try:
        with _exclusive(args.exclusive):
            digest, seconds = compute_check(fault=fault)
        bandwidth = collective_check(args.index, nodes, order, fault=fault) if group else {}
    finally:
        if group:
            dist.destroy_process_group()
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"node": nodes[args.index], "digest": digest, "compute_seconds": seconds,
                               "pair_bandwidth": bandwidth}))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
