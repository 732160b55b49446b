"""Pre-warmed spare processes: a failed rank's container starts without paying Python and torch start-up.

Starting ``python -m lifeline trainer`` costs seconds before the first line of the runtime runs
(interpreter, torch, the model's modules: 2–4 s on two shared cores), and that time is most of an
in-place restart or a replacement. A :class:`Spare` is a process of the launcher's Python that has
already imported those modules and waits on its stdin for an assignment (``lifeline.launch._spare_process``);
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
from lifeline.launch.templates import ForkedProcess, Template

__all__ = ["Spare", "SparePool", "PRELOAD", "spare_env", "wanted_spares"]

PRELOAD: Mapping[str, tuple[str, ...]] = {
    "trainer": ("torch", "torch.distributed", "torch._inductor", "lifeline.cli", "lifeline.api.pod",
                "lifeline.checkpoint", "lifeline.runtime._context", "lifeline.runtime._training",
                "lifeline.runtime._checkpointer", "lifeline.runtime._sidecar", "lifeline.runtime._loop",
                "lifeline.runtime._front", "torch.nn.parallel", "torch.optim.lr_scheduler", "lifeline.models.cli",
                "lifeline.models.gpt_moe._main", "lifeline.sidecar.client", "lifeline.catalog", "lifeline.models.gpt_moe"),
    "sidecar": ("torch", "lifeline.cli", "lifeline.api.pod", "lifeline.checkpoint", "lifeline.sidecar.server",
                "lifeline.sidecar._logging", "lifeline.sidecar._trainer_conn", "lifeline.sidecar._peer_conn",
                "lifeline.sidecar._workers", "lifeline.catalog", "lifeline.sidecar.peer",
                "lifeline.sidecar.client.reader", "lifeline.control", "lifeline.sidecar.ulog"),
}
"""Modules a spare of each role imports before it waits (what ``python -m lifeline trainer`` /
``sidecar`` import on their way to the first useful line — and a script of one's own on the public
SDK, ``lifeline.runtime.train`` over ``DistributedDataParallel``, docs/sdk.md; a missing one is skipped).
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
            proc = subprocess.Popen([sys.executable, "-m", "lifeline.launch._spare_process", *preload], env=dict(env),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, close_fds=True)
        return cls(node, role, proc)

    @classmethod
    def fork(cls, node: str, role: str, template: Template, log: Path) -> Spare:
        """Fork a spare of ``role`` for ``node`` from ``template`` (ready within milliseconds: it
        has the template's imports); its own output before the assignment goes to ``log``.

        Raises:
            OSError: the template could not fork (start a fresh spare instead).
        """
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            proc = ForkedProcess(template, [f"spare:{role}:{node}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=handle)
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
    """Spares per (node, role): forked from one template per role when ``templates`` (a spare then
    costs milliseconds, see :mod:`lifeline.launch.templates`), else fresh processes started one at
    a time.

    Args:
        envs: per role, the base environment of a spare (a rank's process of that role minus the
            pod's ``LIFELINE_*`` settings: :func:`spare_env`).
        log_dir: spares log to ``spare-<node>-<role>.log`` until assigned, templates to
            ``template-<role>.log``.
        templates: fork spares from templates; a role whose template cannot run (not Linux, it
            failed its single-thread check, it died) falls back to fresh spares, named in
            :attr:`no_template`.
    """

    RETRY_SECONDS = 30.0
    """After a spare died before it was ready, no new spare starts for this long (no crash loop)."""

    def __init__(self, envs: Mapping[str, Mapping[str, str]], log_dir: Path, *, templates: bool = False) -> None:
        self.envs = {role: dict(env) for role, env in envs.items()}
        self.log_dir = log_dir
        self.spares: list[Spare] = []
        self.paused_until = 0.0
        self.use_templates = templates
        self.templates: dict[str, Template] = {}
        self.no_template: dict[str, str] = {}

    def start_templates(self) -> None:
        """Start the template of every role now (each imports in the background)."""
        for role in self.envs:
            self._template(role, start=True)

    def _template(self, role: str, *, start: bool) -> Template | None:
        """The role's live template (started when ``start`` and none runs), or ``None`` (templates
        off, not started, or failed: then the role uses fresh spares)."""
        if not self.use_templates or role in self.no_template:
            return None
        template = self.templates.get(role)
        if template is None and start:
            try:
                template = self.templates[role] = Template(role, self.envs[role], self.log_dir / f"template-{role}.log",
                                                           PRELOAD[role])
            except OSError as err:
                self.no_template[role] = str(err)
                return None
        if template is not None and not template.alive():
            self.no_template[role] = template.failure or f"the template exited with {template.proc.returncode}"
            template.stop()
            del self.templates[role]
            return None
        return template

    def fresh(self, node: str, role: str) -> Spare | None:
        """A spare of ``role`` for ``node`` forked now from the role's template (for a process that
        starts at once, or to fill the pool), or ``None`` when no template is ready (the caller
        starts a fresh process)."""
        template = self._template(role, start=False)
        if template is None or not template.ready():
            return None
        try:
            return Spare.fork(node, role, template, self.log_dir / f"spare-{node}-{role}.log")
        except (OSError, ValueError) as err:
            self.no_template[role] = f"fork failed: {err}"
            template.stop()
            self.templates.pop(role, None)
            return None

    def take(self, node: str, role: str) -> Spare | None:
        """Remove and return a live spare of ``role`` for ``node`` (ready ones first), or ``None``."""
        live = [s for s in self.spares if s.node == node and s.role == role and s.alive()]
        if not live:
            return None
        spare = max(live, key=lambda s: (s.ready(), -s.started_at))
        self.spares.remove(spare)
        return spare

    def _warming(self) -> int:
        return sum(s.alive() and not s.ready() for s in self.spares) + \
            sum(t.alive() and not t.ready() for t in self.templates.values())

    def fill(self, wanted: Iterable[tuple[str, str, int]], *, max_warming: int | None = 1) -> Spare | None:
        """Start at most one spare (or the template it is forked from) towards ``wanted`` —
        ``(node, role, count)`` in priority order — unless ``max_warming`` spares or templates are
        still importing (``None``: no limit); drop dead spares and spares of nodes no longer wanted.
        Returns the spare started, if any (``None`` also when a template was started or is importing)."""
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
        for node, role, count in wanted:
            if sum(1 for s in self.spares if s.node == node and s.role == role) >= count:
                continue
            template = self._template(role, start=False)
            if template is not None and template.ready():
                spare = self.fresh(node, role)
                if spare is not None:
                    self.spares.append(spare)
                    return spare
                continue  # the template failed: the next round starts fresh spares for this role
            if max_warming is not None and self._warming() >= max_warming:
                return None
            if template is not None:
                continue  # importing: forks come once it is ready
            if self._template(role, start=True) is not None:
                return None
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
        deadline = time.monotonic() + timeout
        while True:
            while self.fill(wanted, max_warming=None) is not None:
                pass
            complete = all(sum(1 for s in self.spares if s.node == n and s.role == r) >= c for n, r, c in wanted)
            if complete and all(s.ready() for s in self.spares):
                return
            if any(not s.alive() for s in self.spares):
                raise ClusterError(f"a spare process exited while importing; see {self.log_dir}/spare-*.log")
            if time.monotonic() > deadline:
                raise ClusterError(f"spares not ready within {timeout:.0f} s; see {self.log_dir}/spare-*.log "
                                   f"and template-*.log")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """Process ids of the waiting spares."""
        return [s.proc.pid for s in self.spares if s.alive()]

    def template_pids(self) -> dict[str, int]:
        """Process ids of the live templates, by role."""
        return {role: t.proc.pid for role, t in self.templates.items() if t.alive()}

    def close(self) -> None:
        """Stop every waiting spare and every template."""
        for spare in self.spares:
            spare.stop()
        self.spares.clear()
        for template in self.templates.values():
            template.stop()
        self.templates.clear()


def wanted_spares(node_of_rank: Mapping[int, str], nodes: Mapping[str, NodeState], cool_downs: Mapping[str, float], *,
                  per_node: int, standby_nodes: int, now: float) -> list[tuple[str, str, int]]:
    """``(node, role, count)`` in priority order: ``per_node`` trainers on each rank's node, then a
    sidecar and a trainer on each of the first ``standby_nodes`` free, ready, schedulable nodes outside cool-down
    (by name: the order in which ``lifeline.control`` places replacements). Empty when ``per_node`` is 0."""
    if per_node <= 0:
        return []
    used = set(node_of_rank.values())
    free = sorted(name for name, node in nodes.items()
                  if name not in used and node.ready and node.schedulable and cool_downs.get(name, 0.0) <= now)
    wanted = [(node_of_rank[r], "trainer", per_node) for r in sorted(node_of_rank)]
    for node in free[:standby_nodes]:
        wanted += [(node, "sidecar", per_node), (node, "trainer", per_node)]
    return wanted


def spare_env(spec: ProcessSpec) -> dict[str, str]:
    """A spare's base environment: a rank process's without the pod's ``LIFELINE_*`` settings."""
    return {k: v for k, v in spec.env.items() if not k.startswith("LIFELINE_")}

