"""Test helpers: run trainer ranks as real processes configured by LIFELINE_* variables."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from lifeline._poll import wait_for
from lifeline.runtime.events import read_events

SECRET = "runtime-test-secret-0123456789"


def job_name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def rank_env(job: str, rank: int, world: int, redis_url: str, **extra: str) -> dict[str, str]:
    """Environment of one rank; each rank gets its own loopback pod IP (127.0.0.<rank+2>)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    env.update(
        LIFELINE_JOB=job, LIFELINE_RANK=str(rank), LIFELINE_WORLD_SIZE=str(world), LIFELINE_SECRET=SECRET,
        LIFELINE_REDIS_URL=redis_url, LIFELINE_POD_IP=f"127.0.0.{rank + 2}", GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1", LIFELINE_RENDEZVOUS_TIMEOUT_SECONDS="120", LIFELINE_COLLECTIVE_TIMEOUT_SECONDS="10",
        LIFELINE_RECOVERY_TIMEOUT_SECONDS="120",
    )
    env.update(extra)
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``python <args>`` with stdout+stderr to ``log``."""
    handle = open(log, "wb")
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=handle, stderr=subprocess.STDOUT)
    handle.close()
    return proc


def wait_all(procs: dict[int, subprocess.Popen], logs: dict[int, Path], timeout: float = 240) -> None:
    """Wait for every process; assert each exited 0 (showing the log tail otherwise)."""
    deadline = time.monotonic() + timeout
    try:
        for rank, proc in procs.items():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        stop(procs)
    for rank, proc in procs.items():
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{logs[rank].read_text()[-4000:]}"


def stop(procs: dict[int, subprocess.Popen]) -> None:
    """Kill whatever is still running (only the processes this test started)."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def events(log: Path) -> list[dict]:
    """The JSON-line events a rank printed."""
    return read_events([log])


def await_condition(cond: Callable[[], object], timeout: float, what: str, poll: float = 0.01):
    """Poll ``cond`` until truthy (returning its value); ``TimeoutError`` after ``timeout`` seconds."""
    return wait_for(cond, timeout, what, poll)
