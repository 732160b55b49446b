"""One container of a pod on a process node: its process, restart back-off, exit record and status entry.

A :class:`Container` keeps, under its pod's directory, ``containers/<name>.pid`` while a run is alive
(its process-group id) and ``logs/<name>/<run>.log`` per run (``run`` = the restart count at start).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from lifeline.devcluster import _proc
from lifeline.devcluster._identity import ProcessRef
from lifeline.devcluster.node._common import now_rfc3339
from lifeline.devcluster.node.probes import Prober, resolve_argv
from lifeline.devcluster.node.volumes import expand

__all__ = ["Container"]

BACKOFF_START, BACKOFF_MAX, BACKOFF_RESET = 1.0, 20.0, 60.0
"""Restart back-off in seconds: first delay, cap (doubling in between), and the run length that resets it."""


class Container:
    """Runtime state of one container (spec + current process + history).

    Args:
        spec: the container's entry of the pod spec (a dict, camelCase keys).
        init: whether it is an init container.
        pod_dir: the pod's directory on the node.
    """

    def __init__(self, spec: dict, init: bool, pod_dir: Path) -> None:
        self.spec, self.name, self.init = spec, spec["name"], init
        self.pod_dir = pod_dir
        self.proc: subprocess.Popen | None = None
        self.started_at: str | None = None
        self.started_mono = 0.0
        self.restart_count = 0
        self.last_state: dict = {}
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.backoff = BACKOFF_START
        self.next_start = 0.0
        self.readiness: Prober | None = None
        self.liveness: Prober | None = None
        self.startup: Prober | None = None
        self.env: dict[str, str] = {}
        self.cwd = "/"
        self.done = False  # terminated for good (no restart pending)

    @property
    def running(self) -> bool:
        """Whether a run's process is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def started_ok(self) -> bool:
        """Running and past its startup probe (if any): the status field ``started``."""
        return self.running and (self.startup is None or self.startup.result is True)

    @property
    def ready(self) -> bool:
        """Started and passing its readiness probe (if any): the status field ``ready``."""
        if not self.started_ok:
            return False
        return self.readiness is None or self.readiness.result is True

    @property
    def pid_file(self) -> Path:
        """``<pod dir>/containers/<name>.pid``: present while a run is alive."""
        return self.pod_dir / "containers" / f"{self.name}.pid"

    def start(self) -> None:
        """Start a run: ``command`` + ``args`` (``$(VAR)``-expanded with :attr:`env`) as a process group in
        :attr:`cwd`, output to its run's log file, probes armed. With no command the container fails
        for good (``CreateContainerError``); when the executable cannot start, a restart is scheduled."""
        argv = [*(self.spec.get("command") or []), *(self.spec.get("args") or [])]
        argv = resolve_argv([expand(a, self.env) for a in argv])
        run = self.restart_count
        logdir = self.pod_dir / "logs" / self.name
        logdir.mkdir(parents=True, exist_ok=True)
        if not argv:
            self.state = {"waiting": {"reason": "CreateContainerError",
                                      "message": "no command: dev-cluster nodes do not read image entrypoints; "
                                                 "set command/args"}}
            self.done = True
            return
        try:
            self.proc = _proc.spawn(argv, log=logdir / f"{run}.log", env=self.env, cwd=Path(self.cwd))
        except OSError as err:
            self.state = {"waiting": {"reason": "RunContainerError", "message": f"{argv[0]}: {err}"}}
            self.proc = None
            self.schedule_restart(time.monotonic())
            return
        self.pid_file.write_text(str(ProcessRef.of(self.proc.pid)))  # checked before any signal
        self.started_at = now_rfc3339()
        self.started_mono = time.monotonic()
        self.state = {"running": {"startedAt": self.started_at}}
        rp, lp, sp = (self.spec.get(k) for k in ("readinessProbe", "livenessProbe", "startupProbe"))
        self.readiness = Prober(rp, self.started_mono) if rp else None
        self.liveness = Prober(lp, self.started_mono) if lp else None
        self.startup = Prober(sp, self.started_mono) if sp else None

    def record_exit(self, code: int) -> None:
        """Record the end of the current run with exit status ``code`` (negative: killed by that signal)."""
        if code < 0:  # killed by a signal: report it as a shell would (128 + signal)
            code = 128 - code
        reason = "Completed" if code == 0 else "Error"
        self.state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": self.started_at,
                                     "finishedAt": now_rfc3339(), "containerID": f"lifeline://{self.proc.pid}"}}
        self.pid_file.unlink(missing_ok=True)
        if time.monotonic() - self.started_mono > BACKOFF_RESET:
            self.backoff = BACKOFF_START
        self.proc = None
        self.readiness = self.liveness = self.startup = None

    def schedule_restart(self, now: float) -> None:
        """Count a restart and schedule it after the back-off (``now``: ``time.monotonic()``); ``CrashLoopBackOff``."""
        self.last_state = self.state if "terminated" in self.state else self.last_state
        self.restart_count += 1
        self.next_start = now + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        msg = self.state.get("terminated", {})
        self.state = {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": f"back-off restarting container {self.name} (last exit code "
                                             f"{msg.get('exitCode')})"}}

    def status(self) -> dict:
        """The container's entry of the pod's ``containerStatuses`` (or ``initContainerStatuses``)."""
        s = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "", "ready": self.ready,
             "started": self.started_ok, "restartCount": self.restart_count, "state": self.state,
             "lastState": self.last_state}
        if self.proc is not None:
            s["containerID"] = f"lifeline://{self.proc.pid}"
        elif "terminated" in self.state:
            s["containerID"] = self.state["terminated"].get("containerID", "")
        return s
