"""Helpers for the sidecar tests: settings, in-process sidecars, sidecar/trainer processes, polling."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lifeline import _poll
from lifeline.api.pod import SidecarSettings, TrainerSettings

SECRET = "a-job-secret-of-32-characters!!!"
HERE = Path(__file__).parent


wait_for = _poll.wait_for  # re-exported for the tests of this folder


@pytest.fixture
def job():
    """A fresh job name per test (Redis keys are namespaced by it)."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def arena_root():
    """A Memory-backed directory for the test's arenas, removed afterwards."""
    root = Path("/dev/shm") / f"lifeline-test-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_settings(job, arena_root, redis_server):
    """Build (sidecar, trainer) settings for a rank: node ``n<rank>``, pod IP ``127.0.0.<rank+1>``."""

    def make(rank: int, world_size: int, *, node: str | None = None, ip: str | None = None, arena: str | None = None,
             trainer: dict | None = None, **sidecar):
        common = dict(job=job, rank=rank, world_size=world_size, secret=SECRET,
                      arena_dir=arena_root / (arena or f"r{rank}"), slot_bytes=sidecar.pop("slot_bytes", 1 << 20),
                      slots=sidecar.pop("slots", 3), node=node or f"n{rank}")
        sc = dict(redis_url=redis_server.url, pod_ip=ip or f"127.0.0.{rank + 1}", peer_port=0, metrics_port=0,
                  heartbeat_seconds=0.3, persist_every=0)
        sc.update(sidecar)
        return SidecarSettings(**common, **sc), TrainerSettings(**common, **(trainer or {}))

    return make


@pytest.fixture
def sidecars():
    """Start in-process sidecars with ``start(settings)``; all are stopped after the test."""
    from lifeline.sidecar.server import Sidecar

    started = []

    def start(settings):
        sc = Sidecar(settings).start()
        started.append(sc)
        return sc

    yield start
    for sc in started:
        if not sc.stopping.is_set():
            sc.stop()


def sidecar_env(s: SidecarSettings) -> dict[str, str]:
    """The ``LIFELINE_*`` environment that reproduces settings ``s`` in a process."""
    env = dict(os.environ)
    for name, value in s.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"LIFELINE_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


class Proc:
    """A child process in its own process group, killed (SIGKILL) on demand or at teardown."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = open(log, "wb")
        self.p = subprocess.Popen(argv, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()
        if not self._fh.closed:
            self._fh.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"process timed out; log:\n{self.log.read_text()[-3000:]}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def procs(tmp_path):
    """Spawn processes with ``spawn(name, argv, env)``; every one is killed after the test."""

    class Spawner:
        def __init__(self) -> None:
            self.started: list[Proc] = []

        def __call__(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
            p = Proc(argv, env, tmp_path / f"{name}.log")
            self.started.append(p)
            return p

        def kill(self, name: str) -> None:
            for p in self.started:
                if p.log.stem == name:
                    p.kill()

    spawner = Spawner()
    yield spawner
    for p in spawner.started:
        p.kill()


def sidecar_argv() -> list[str]:
    return [sys.executable, "-m", "lifeline", "sidecar"]


def trainer_argv(*args: str) -> list[str]:
    return [sys.executable, str(HERE / "_trainer.py"), *args]
