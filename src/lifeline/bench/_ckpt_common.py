"""The checkpoint bench's harness: the state, timing with peers interleaved, and page-cache control.

Every timed sample of a run lands in :data:`SAMPLES` and each peer's median CPU seconds in :data:`CPU`
(cleared by :func:`lifeline.bench.checkpoint.run` at its start).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["GiB", "make_state", "nbytes", "SAMPLES", "CPU", "cpu_seconds", "interleaved", "timed", "drop_cache",
           "warm", "fsync_path", "check_equal"]

GiB = float(1 << 30)


def make_state(total_bytes: int, tensors: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``tensors`` float32 tensors of shape ``[rows, 1024]`` totalling about ``total_bytes`` (rows a multiple of 8)."""
    g = torch.Generator().manual_seed(seed)
    rows = max(8, (total_bytes // tensors // 4096) // 8 * 8)
    return {f"layers.{i}.weight": torch.randn(rows, 1024, generator=g) for i in range(tensors)}


def nbytes(state: dict[str, torch.Tensor]) -> int:
    """Total size of ``state``'s tensors in bytes."""
    return sum(t.numel() * t.element_size() for t in state.values())


SAMPLES: dict[str, list[float]] = {}
"""Every timed sample of the current run (``<row>/<peer>`` -> seconds, in repeat order), for the JSON."""
CPU: dict[str, float] = {}
"""Median CPU seconds (user + system, every thread of this process) per ``<row>/<peer>``: robust to the
machine's background load, which stretches wall times of CPU-bound peers alike."""


def cpu_seconds() -> float:
    """CPU seconds (user + system) of every thread of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def interleaved(fns: dict[str, Callable[[int], float]], repeats: int,
                settle: Callable[[str, int], None] | None = None, row: str = "") -> dict[str, float]:
    """Median time of each peer; peers take turns (A B C, B C A, ...: order rotated every repeat) so
    that the machine's background load hits all of them alike. ``settle(name, i)`` runs (untimed)
    before every measurement: on the filesystem it syncs and drops the page cache of the bench's
    files (the same cache state for every peer) or, for hot loads, reads the peer's files."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        for name in names[i % len(names):] + names[: i % len(names)]:
            if settle is not None:
                settle(name, i)
            c0 = cpu_seconds()
            times[name].append(fns[name](i))
            cpu[name].append(cpu_seconds() - c0)
    for n, t in times.items():
        SAMPLES[f"{row}/{n}"] = [round(x, 4) for x in t]
        CPU[f"{row}/{n}"] = round(statistics.median(cpu[n]), 4)
    return {n: statistics.median(t) for n, t in times.items()}


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took (``time.perf_counter``)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def drop_cache(root: Path) -> None:
    """Write back everything (``os.sync``), then drop the page cache of every file under ``root``
    (``posix_fadvise(DONTNEED)``; clean pages only, so after the sync: all of them). Every timed
    save then starts with the same (empty) cache of bench files, whoever wrote before it, and
    every timed load reads from the device: the restore case (a new node, a cold cache)."""
    os.sync()
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm(paths: list[str]) -> None:
    """Read every file at or under ``paths`` once, into the page cache: the hot-load condition."""
    buf = bytearray(8 << 20)
    for top in paths:
        files = [top] if os.path.isfile(top) else [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def fsync_path(path: str) -> None:
    """fsync the file at ``path`` (OSError if it cannot be opened)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_equal(a: dict, b: dict, what: str) -> None:
    """Raise AssertionError naming ``what`` and the tensor when a tensor of ``a`` differs in ``b``."""
    for k in a:
        if not torch.equal(a[k], b[k]):
            raise AssertionError(f"{what}: tensor {k} differs after the round trip")
