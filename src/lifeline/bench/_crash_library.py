"""``bench crash`` fs and MinIO targets: a forked saver SIGKILLed at a uniformly random time of its save."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from lifeline.bench._crash_check import Counts, Reader
from lifeline.bench._crash_proc import Zygote, sigkill
from lifeline.bench._crash_state import library_full
from lifeline.checkpoint import Storage

CALIBRATION_SAVES = 3
"""Saves run to completion first; the median of their durations bounds the kill time."""


def run_library(cfg: dict[str, Any], storage: Storage, trials: int, rng: random.Random, workdir: Path, *,
                after_kill: Callable[[int], bool] | None = None) -> dict:
    """Run ``trials`` kill trials against ``storage`` (``cfg`` is the zygote's configuration: target,
    storage, ``rows``, ``tensor``, ``data``, ``prefix``, ``job``). Returns the target's JSON row.

    Each trial forks a saver of the next uncommitted step with a fresh seed, sleeps a uniformly random
    time in ``[0, D]`` (``D``: median save duration, seconds) after the saver announces the save, then
    SIGKILLs it and awaits its exit; then :class:`Reader` checks what is visible. ``after_kill(step)``,
    if given, runs after each kill and returns whether the kill left an unfinished multipart upload
    (counted as ``killed_mid_multipart``).
    """
    counts = Counts()
    t0 = time.perf_counter()
    rows = cfg["rows"]
    reader = Reader(storage, cfg["prefix"], cfg["job"], lambda seed: library_full(seed, rows), counts)
    attempts: dict[int, int] = {}
    zygote = Zygote(cfg, workdir / f"zygote-{cfg['target']}.log")
    try:
        durations = []
        step = mid_multipart = 0
        for _ in range(CALIBRATION_SAVES):
            attempts[step] = seed = rng.getrandbits(31)
            zygote.send(f"save {step} {seed} 0")
            durations.append(float(zygote.expect("saved")[1]))
            reader.check(attempts, step)
            step += 1
        bound = statistics.median(durations)
        for _ in range(trials):
            attempts[step] = seed = rng.getrandbits(31)
            zygote.send(f"save {step} {seed} 1")
            pid = int(zygote.expect("saving")[0])
            time.sleep(rng.uniform(0.0, bound))  # the random moment of the crash is the point of the bench
            sigkill(pid)
            counts.trials += 1
            mid_multipart += bool(after_kill and after_kill(step))
            if reader.check(attempts, step):
                counts.killed_after_commit += 1
                step += 1
            else:
                counts.killed_before_commit += 1  # the next trial saves the same step again
        reader.final()
    finally:
        zygote.close()
    counts.seconds = time.perf_counter() - t0
    return {"trials": counts.trials, "killed_before_commit": counts.killed_before_commit,
            "killed_after_commit": counts.killed_after_commit, "committed_and_valid": counts.committed_and_valid,
            "torn_visible": counts.torn_visible, "committed_lost": counts.committed_lost,
            "save_seconds_median": round(bound, 4),
            **({"killed_mid_multipart": mid_multipart} if after_kill else {}), "seconds": round(counts.seconds, 2), "problems": counts.problems}
