"""Local "pods": a rank's sidecar and trainer processes on a named "node" (a loopback address)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lifeline.launch.env import ProcessSpec, RankProcesses
from lifeline.launch.spare_pool import Spare

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

    ``handled`` names the roles whose exit a plan already answered; ``trainer_from_spare`` says
    whether the current trainer process came from a pre-warmed spare (``start_trainer(spare)``);
    ``registered_at`` is when its sidecar was last seen registered on this pod's node.
    """

    spec: RankProcesses
    generation: int
    log_dir: Path
    sidecar: subprocess.Popen | None = None
    trainer: subprocess.Popen | None = None
    handled: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.time)
    sidecar_started_at: float | None = None
    registered_at: float | None = None
    trainer_runs: int = 0
    trainer_started_at: float | None = None
    trainer_from_spare: bool = False

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def node(self) -> str:
        return self.spec.node

    def _log(self, role: str) -> Path:
        return self.log_dir / f"rank-{self.rank}-{self.node}-{role}.log"

    def _launch(self, role: str, spare: Spare | None) -> tuple[subprocess.Popen, bool]:
        spec = self.spec.trainer if role == "trainer" else self.spec.sidecar
        if spare is not None:
            try:
                return spare.assign(spec, self._log(role)), True
            except OSError:  # the spare died: start the container the slow way
                spare.stop()
        return start_process(spec, self._log(role)), False

    def start_sidecar(self, spare: Spare | None = None) -> None:
        """Start the sidecar on a fresh arena directory (the pod's Memory-backed emptyDir), in
        ``spare`` (a pre-warmed or forked process, see :mod:`lifeline.launch.spare_pool`) when given."""
        shutil.rmtree(self.spec.arena_dir, ignore_errors=True)
        self.spec.arena_dir.mkdir(parents=True, exist_ok=True)
        self.sidecar_started_at = time.time()
        self.registered_at = None
        self.sidecar, _ = self._launch("sidecar", spare)
        self.handled.discard("sidecar")

    def start_trainer(self, spare: Spare | None = None, *, pooled: bool = True) -> None:
        """Start (or restart in place) the trainer process, in ``spare`` when given; ``pooled``
        says whether ``spare`` waited in the pool (counted in :attr:`trainer_from_spare`) or was
        forked for this start."""
        self.trainer_started_at = time.time()
        self.trainer, used = self._launch("trainer", spare)
        self.trainer_from_spare = used and pooled
        self.trainer_runs += 1
        self.handled.discard("trainer")

    def exit_code(self, role: str) -> int | None:
        """Exit code of ``role`` (``trainer``/``sidecar``) if it has exited, else ``None``."""
        proc = self.trainer if role == "trainer" else self.sidecar
        return None if proc is None else proc.poll()

    def kill(self, role: str) -> None:
        """SIGKILL ``role`` (failure injection) and reap it."""
        stop_process(self.trainer if role == "trainer" else self.sidecar, sig=signal.SIGKILL)

    def hang(self) -> None:
        """SIGSTOP the trainer (failure injection: a rank that stops making progress without dying)."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.send_signal(signal.SIGSTOP)

    def stop(self, *, grace: float = 5.0, keep_arena: bool = False) -> None:
        """Stop the trainer then the sidecar (SIGTERM, SIGKILL after ``grace``), drop the arena
        (unless ``keep_arena``: freeing a large tmpfs arena takes a while; :meth:`drop_arena` later)."""
        stop_process(self.trainer, grace=grace)
        stop_process(self.sidecar, grace=grace)
        if not keep_arena:
            self.drop_arena()

    def drop_arena(self) -> None:
        """Remove the pod's arena directory (its Memory-backed emptyDir). Never raises."""
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
