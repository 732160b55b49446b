"""Local "pods": a rank's sidecar and trainer processes on a named "node" (a loopback address)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lifeline.launch.env import ProcessSpec, RankProcesses

__all__ = ["Pod", "start_process", "stop_process", "stop_all"]


def start_process(spec: ProcessSpec, log: Path) -> subprocess.Popen:
    """Start ``spec`` with stdout and stderr appended to ``log`` (in the launcher's process group,
    so a kill of the group takes every rank with it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(list(spec.argv), env=dict(spec.env), stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, close_fds=True)


def stop_process(proc: subprocess.Popen | None, *, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` (SIGKILL after ``grace`` seconds) and reap the process. Never raises."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


@dataclass
class Pod:
    """One rank's incarnation: its processes, node and the generation it was created for.

    ``trainer_exit``/``sidecar_exit`` hold exit codes already acted on (``None`` while running).
    """

    spec: RankProcesses
    generation: int
    log_dir: Path
    sidecar: subprocess.Popen | None = None
    trainer: subprocess.Popen | None = None
    handled: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.time)
    registered_at: float | None = None
    trainer_runs: int = 0

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def node(self) -> str:
        return self.spec.node

    def _log(self, role: str) -> Path:
        return self.log_dir / f"rank-{self.rank}-{self.node}-{role}.log"

    def start_sidecar(self) -> None:
        """Start the sidecar on a fresh arena directory (the pod's Memory-backed emptyDir)."""
        shutil.rmtree(self.spec.arena_dir, ignore_errors=True)
        self.spec.arena_dir.mkdir(parents=True, exist_ok=True)
        self.sidecar = start_process(self.spec.sidecar, self._log("sidecar"))
        self.handled.discard("sidecar")

    def start_trainer(self) -> None:
        """Start (or restart in place) the trainer process."""
        self.trainer = start_process(self.spec.trainer, self._log("trainer"))
        self.trainer_runs += 1
        self.handled.discard("trainer")

    def exit_code(self, role: str) -> int | None:
        """Exit code of ``role`` (``trainer``/``sidecar``) if it has exited, else ``None``."""
        proc = self.trainer if role == "trainer" else self.sidecar
        return None if proc is None else proc.poll()

    def kill(self, role: str) -> None:
        """SIGKILL ``role`` (failure injection) and reap it."""
        stop_process(self.trainer if role == "trainer" else self.sidecar, sig=signal.SIGKILL)

    def stop(self, *, grace: float = 5.0) -> None:
        """Stop the trainer then the sidecar (SIGTERM, SIGKILL after ``grace``), drop the arena."""
        stop_process(self.trainer, grace=grace)
        stop_process(self.sidecar, grace=grace)
        shutil.rmtree(self.spec.arena_dir, ignore_errors=True)

    def pids(self) -> dict[str, int]:
        """Process ids of the live processes, by role."""
        return {role: p.pid for role, p in (("sidecar", self.sidecar), ("trainer", self.trainer))
                if p is not None and p.poll() is None}


def stop_all(pods: list[Pod], *, grace: float = 5.0) -> None:
    """Stop every pod's processes at once: SIGTERM to all, then SIGKILL what is left after
    ``grace`` seconds; drop the arenas. Never raises."""
    procs = [p for pod in pods for p in (pod.trainer, pod.sidecar) if p is not None and p.poll() is None]
    for proc in procs:
        try:
            proc.terminate()
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pod in pods:
        shutil.rmtree(pod.spec.arena_dir, ignore_errors=True)
