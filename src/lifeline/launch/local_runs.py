"""Local runs on disk: what ``lifeline jobs``, ``describe``, ``logs`` and ``stop`` read (docs/cli.md).

A run's state dir (default ``.state/run/<job>``) holds ``processes.json`` (written by the supervisor:
``launcher``, the services' pids, ``ranks`` -> role -> pid, ``spares``), ``run.json`` (job, spec file,
start time, launcher pid; written once the run started), ``summary.json`` (``lifeline run``'s summary,
written at the end) and ``logs/rank-<r>-<node>-<role>.log``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lifeline.api import TrainingJob
from lifeline.errors import ConfigError

__all__ = ["RUNS_ROOT", "ROLES", "LocalRun", "find_runs", "open_run", "write_run_record", "write_summary",
           "stop_run", "log_files", "follow"]

RUNS_ROOT = Path(".state") / "run"
"""Where ``lifeline run`` puts state dirs by default (relative to the working directory)."""

ROLES = ("trainer", "sidecar")


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


def write_run_record(state_dir: Path, job: TrainingJob, *, spec_path: Path | None) -> None:
    """Write ``run.json`` into ``state_dir`` (an existing directory): job name, ranks, steps, spec file,
    start time (seconds since epoch) and this process's pid (the launcher). Raises ``OSError``."""
    _write_json(state_dir / "run.json", {
        "job": job.name, "ranks": job.spec.layout.world_size, "steps": job.spec.steps,
        "spec": str(spec_path.resolve()) if spec_path else None, "started_at": time.time(), "launcher": os.getpid()})


def write_summary(state_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` (atomically) into ``state_dir`` if it exists; never raises ``OSError``."""
    try:
        if state_dir.is_dir():
            _write_json(state_dir / "summary.json", summary)
    except OSError:
        pass


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process not yet reaped (a zombie) is gone; a pid reused by another program is not ours
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return True
    return not cmdline or b"lifeline" in cmdline  # empty: just started, not yet known


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class LocalRun:
    """One state dir: ``processes`` (processes.json), ``record`` (run.json), ``summary`` (summary.json;
    ``{}`` when absent or unreadable)."""

    name: str
    state_dir: Path
    processes: dict[str, Any]
    record: dict[str, Any]
    summary: dict[str, Any]

    @property
    def launcher(self) -> int | None:
        """The launcher's pid (``lifeline run``), if recorded."""
        pid = self.processes.get("launcher") or self.record.get("launcher")
        return int(pid) if pid else None

    @property
    def running(self) -> bool:
        """Whether the launcher is alive."""
        return _alive(self.launcher)

    @property
    def status(self) -> str:
        """``running``, the summary's phase (``Succeeded``/``Failed``), or ``ended`` (stopped or killed)."""
        if self.running:
            return "running"
        return str(self.summary.get("phase") or "ended")

    def pids(self) -> dict[str, int]:
        """Every recorded pid by name (``launcher``, services, ``rank-<r>-<role>``, ``spare-<i>``,
        ``template-<role>``)."""
        out = {k: int(v) for k, v in self.processes.items() if isinstance(v, int)}
        for rank, roles in (self.processes.get("ranks") or {}).items():
            out.update({f"rank-{rank}-{role}": int(pid) for role, pid in roles.items()})
        out.update({f"spare-{i}": int(pid) for i, pid in enumerate(self.processes.get("spares") or [])})
        out.update({f"template-{role}": int(pid) for role, pid in (self.processes.get("templates") or {}).items()})
        return out

    @classmethod
    def load(cls, state_dir: Path) -> LocalRun:
        """Read the run at ``state_dir`` (missing files read as empty)."""
        record = _read(state_dir / "run.json")
        summary = _read(state_dir / "summary.json")
        name = record.get("job") or summary.get("job") or state_dir.name
        return cls(str(name), state_dir, _read(state_dir / "processes.json"), record, summary)


def _is_run(path: Path) -> bool:
    return path.is_dir() and any((path / f).exists() for f in ("processes.json", "run.json", "summary.json"))


def find_runs(root: Path = RUNS_ROOT) -> list[LocalRun]:
    """Every local run under ``root`` (directories holding processes.json, run.json or summary.json), by name."""
    if not root.is_dir():
        return []
    return [LocalRun.load(p) for p in sorted(root.iterdir()) if _is_run(p)]


def open_run(job: str, root: Path = RUNS_ROOT) -> LocalRun:
    """The run named ``job`` under ``root``, or the state dir ``job`` itself.

    Raises:
        ConfigError: no such run (``field`` ``JOB``; the message lists the runs there).
    """
    for path in (Path(job), root / job):
        if _is_run(path):
            return LocalRun.load(path)
    known = ", ".join(r.state_dir.name for r in find_runs(root)) or "none"
    raise ConfigError(f"JOB {job!r}: no local run named so under {root} (runs there: {known}); pass a job name "
                      "or a state dir (lifeline jobs lists them)", field="JOB")


def stop_run(run: LocalRun, *, grace: float = 30.0) -> dict[str, Any]:
    """SIGTERM the run's launcher (which stops everything it started) and wait up to ``grace`` seconds.

    Returns:
        ``{"stopped": bool, "launcher": pid, "seconds": float, "left": {name: pid}}``: ``left`` lists
        recorded processes still alive afterwards. ``stopped`` is ``False`` when it was not running.
    """
    pid = run.launcher
    if not run.running or pid is None:
        return {"stopped": False, "launcher": pid, "seconds": 0.0, "left": {}}
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while _alive(pid) and time.monotonic() - t0 < grace:
        time.sleep(0.05)
    left = {name: p for name, p in run.pids().items() if name != "launcher" and _alive(p)}
    if _alive(pid):
        left["launcher"] = pid
    return {"stopped": "launcher" not in left, "launcher": pid, "seconds": round(time.monotonic() - t0, 3),
            "left": left}


def log_files(run: LocalRun, *, rank: int | None = None, role: str | None = None) -> list[Path]:
    """The run's log files (``logs/rank-<r>-<node>-<role>.log``), oldest node first, for ``rank``/``role``.

    Raises:
        ConfigError: ``role`` is not trainer or sidecar (``--role``), or nothing matches (``--rank``).
    """
    if role is not None and role not in ROLES:
        raise ConfigError(f"--role {role!r}: use trainer or sidecar", field="--role")
    pattern = f"rank-{'*' if rank is None else rank}-*-{role or '*'}.log"
    files = sorted((run.state_dir / "logs").glob(pattern), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        what = " ".join(x for x in (f"rank {rank}" if rank is not None else "", role or "") if x) or "any process"
        raise ConfigError(f"--rank: run {run.name} has no logs of {what} in {run.state_dir / 'logs'}",
                          field="--rank" if rank is not None else "--role")
    return files


def follow(files: list[Path], *, poll: float = 0.2, until=None) -> Iterator[str]:
    """Lines appended to ``files`` from their current ends, forever or until ``until()`` is true."""
    offsets = {f: f.stat().st_size for f in files}
    while until is None or not until():
        for f in files:
            with open(f, "rb") as h:
                h.seek(offsets[f])
                data = h.read()
            if data:
                offsets[f] += len(data)
                yield from data.decode(errors="replace").splitlines()
        time.sleep(poll)
