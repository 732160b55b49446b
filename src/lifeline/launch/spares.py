"""Pre-warmed spare processes: a failed rank's container starts without paying Python and torch start-up.

Starting ``python -m lifeline trainer`` costs seconds before the first line of the runtime runs
(interpreter, torch, the model's modules: 2–4 s on two shared cores), and that time is most of an
in-place restart or a replacement. A :class:`Spare` is a process of the launcher's Python that has
already imported those modules and waits on its stdin for an assignment (``lifeline.launch._spare``);
:meth:`Spare.assign` hands it a container's argv, environment and log, and it becomes that
container — same command, same ``LIFELINE_*`` environment as a fresh process, same log file.

:class:`SparePool` keeps spares per node and role (``trainer``; ``sidecar`` on standby nodes) and
starts them one at a time, so warming never takes more than one core from training. What
the supervisor asks of it is in :class:`lifeline.launch.supervisor.LaunchOptions` and
docs/launch.md ("Spares").
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lifeline.control import NodeState
from lifeline.errors import ClusterError
from lifeline.launch.env import ProcessSpec

__all__ = ["Spare", "SparePool", "PRELOAD", "spare_env", "wanted_spares"]

PRELOAD: Mapping[str, tuple[str, ...]] = {
    "trainer": ("torch", "torch.distributed", "torch._inductor", "lifeline.cli", "lifeline.api.pod",
                "lifeline.checkpoint", "lifeline.runtime._context", "lifeline.runtime._training",
                "lifeline.runtime._checkpointer",
                "lifeline.runtime._sidecar", "lifeline.models.cli", "lifeline.models.gpt_moe._main", "lifeline.sidecar.client",
                "lifeline.catalog", "lifeline.models.gpt_moe"),
    "sidecar": ("torch", "lifeline.cli", "lifeline.api.pod", "lifeline.checkpoint", "lifeline.sidecar.server",
                "lifeline.sidecar._logging", "lifeline.sidecar._trainer_conn", "lifeline.sidecar._peer_conn",
                "lifeline.sidecar._workers", "lifeline.catalog", "lifeline.sidecar.peer",
                "lifeline.sidecar.reader", "lifeline.control", "lifeline.sidecar.ulog"),
}
"""Modules a spare of each role imports before it waits (what ``python -m lifeline trainer`` /
``sidecar`` import on their way to the first useful line; a missing one is skipped).
``torch._inductor`` is there because ``torch.use_deterministic_algorithms`` (the reference
trainer's ``deterministic_cpu``) imports it, with dynamo and sympy: 2–5 s on a loaded machine;
torch's optimizers import dynamo (and so inductor) anyway, in ``add_param_group``'s
``torch._disable_dynamo`` wrapper, so a trainer process pays it whatever it calls."""


@dataclass
class Spare:
    """One waiting process (``role`` ``trainer`` or ``sidecar``) reserved for ``node``.

    ``proc`` is the :class:`subprocess.Popen`; once assigned it *is* the container's process
    (exit code, signals and pid as for a freshly started one).
    """

    node: str
    role: str
    proc: subprocess.Popen
    started_at: float = field(default_factory=time.time)
    ready_at: float | None = None

    @classmethod
    def start(cls, node: str, role: str, env: Mapping[str, str], log: Path,
              modules: Iterable[str] | None = None) -> Spare:
        """Start a spare of ``role`` for ``node`` with ``env`` (the launcher's base environment,
        no ``LIFELINE_*`` pod settings) that preloads ``modules`` (default: ``PRELOAD[role]``);
        its own output before the assignment goes to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        preload = list(PRELOAD[role] if modules is None else modules)
        with open(log, "ab") as handle:
            proc = subprocess.Popen([sys.executable, "-m", "lifeline.launch._spare", *preload], env=dict(env),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, close_fds=True)
        return cls(node, role, proc)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def ready(self) -> bool:
        """Whether it finished its imports (reads its ``ready`` line without blocking)."""
        if self.ready_at is None and self.alive() and self.proc.stdout is not None:
            readable, _, _ = select.select([self.proc.stdout], [], [], 0)
            if readable:
                line = self.proc.stdout.readline()
                if line:
                    self.ready_at = time.time()
        return self.ready_at is not None

    def assign(self, spec: ProcessSpec, log: Path) -> subprocess.Popen:
        """Make this spare run ``spec`` (argv, env) with output appended to ``log``; returns its process.

        Raises:
            OSError: the spare died (the caller starts a fresh process instead).
        """
        if not self.alive():
            raise OSError(f"spare {self.proc.pid} for {self.node} exited with {self.proc.returncode}")
        doc = {"argv": list(spec.argv), "env": dict(spec.env), "log": str(log)}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(doc) + "\n").encode())
        self.proc.stdin.flush()
        self.proc.stdin.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc

    def stop(self) -> None:
        """Stop a spare that was never assigned (EOF on stdin, then SIGKILL). Never raises."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.close()
            if self.proc.stdout is not None and not self.proc.stdout.closed:
                self.proc.stdout.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class SparePool:
    """Spares per (node, role), started one at a time.

    Args:
        envs: per role, the base environment of a spare (a rank's process of that role minus the
            pod's ``LIFELINE_*`` settings: :func:`spare_env`).
        log_dir: spares log to ``spare-<node>-<role>.log`` until assigned.
    """

    RETRY_SECONDS = 30.0
    """After a spare died before it was ready, no new spare starts for this long (no crash loop)."""

    def __init__(self, envs: Mapping[str, Mapping[str, str]], log_dir: Path) -> None:
        self.envs = {role: dict(env) for role, env in envs.items()}
        self.log_dir = log_dir
        self.spares: list[Spare] = []
        self.paused_until = 0.0

    def take(self, node: str, role: str) -> Spare | None:
        """Remove and return a live spare of ``role`` for ``node`` (ready ones first), or ``None``."""
        live = [s for s in self.spares if s.node == node and s.role == role and s.alive()]
        if not live:
            return None
        spare = max(live, key=lambda s: (s.ready(), -s.started_at))
        self.spares.remove(spare)
        return spare

    def fill(self, wanted: Iterable[tuple[str, str, int]], *, max_warming: int | None = 1) -> Spare | None:
        """Start at most one spare towards ``wanted`` — ``(node, role, count)`` in priority order —
        unless ``max_warming`` spares are still importing (``None``: no limit); drop dead spares and
        spares of nodes no longer wanted. Returns the spare started, if any."""
        wanted = list(wanted)
        keep = {(n, r) for n, r, c in wanted if c > 0}
        for spare in list(self.spares):
            if not spare.alive() or (spare.node, spare.role) not in keep:
                if not spare.alive() and spare.ready_at is None:
                    self.paused_until = time.time() + self.RETRY_SECONDS
                self.spares.remove(spare)
                spare.stop()
        if time.time() < self.paused_until:
            return None
        if max_warming is not None and sum(s.alive() and not s.ready() for s in self.spares) >= max_warming:
            return None
        for node, role, count in wanted:
            have = sum(1 for s in self.spares if s.node == node and s.role == role)
            if have < count:
                spare = Spare.start(node, role, self.envs[role], self.log_dir / f"spare-{node}-{role}.log")
                self.spares.append(spare)
                return spare
        return None

    def warm_all(self, wanted: Iterable[tuple[str, str, int]], timeout: float = 600.0) -> None:
        """Start every spare ``wanted`` asks for and wait until all are ready.

        Raises:
            ClusterError: a spare exited while importing (its log names why), or not all were
                ready within ``timeout`` seconds.
        """
        wanted = list(wanted)
        while self.fill(wanted, max_warming=None) is not None:
            pass
        deadline = time.monotonic() + timeout
        while not all(s.ready() for s in self.spares):
            if any(not s.alive() for s in self.spares):
                raise ClusterError(f"a spare process exited while importing; see {self.log_dir}/spare-*.log")
            if time.monotonic() > deadline:
                raise ClusterError(f"spares not ready within {timeout:.0f} s; see {self.log_dir}/spare-*.log")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """Process ids of the waiting spares."""
        return [s.proc.pid for s in self.spares if s.alive()]

    def close(self) -> None:
        """Stop every waiting spare."""
        for spare in self.spares:
            spare.stop()
        self.spares.clear()


def wanted_spares(node_of_rank: Mapping[int, str], nodes: Mapping[str, NodeState], cool_downs: Mapping[str, float], *,
                  per_node: int, standby_nodes: int, now: float) -> list[tuple[str, str, int]]:
    """``(node, role, count)`` in priority order: ``per_node`` trainers on each rank's node, then a
    sidecar and a trainer on each of the first ``standby_nodes`` free, ready nodes outside cool-down
    (by name: the order in which ``lifeline.control`` places replacements). Empty when ``per_node`` is 0."""
    if per_node <= 0:
        return []
    used = set(node_of_rank.values())
    free = sorted(name for name, node in nodes.items()
                  if name not in used and node.ready and cool_downs.get(name, 0.0) <= now)
    wanted = [(node_of_rank[r], "trainer", per_node) for r in sorted(node_of_rank)]
    for node in free[:standby_nodes]:
        wanted += [(node, "sidecar", per_node), (node, "trainer", per_node)]
    return wanted


def spare_env(spec: ProcessSpec) -> dict[str, str]:
    """A spare's base environment: a rank process's without the pod's ``LIFELINE_*`` settings."""
    return {k: v for k, v in spec.env.items() if not k.startswith("LIFELINE_")}

