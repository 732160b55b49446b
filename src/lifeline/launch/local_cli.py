"""``lifeline jobs | describe | logs | stop``: local runs, read from their state dirs (:mod:`.local`)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from lifeline.launch.local_runs import RUNS_ROOT, find_runs, follow, log_files, open_run, stop_run

__all__ = ["jobs_command", "describe_command", "logs_command", "stop_command"]

_ROOT = typer.Option(RUNS_ROOT, "--root", help="Where the state dirs are.")
_JOB = typer.Argument(..., metavar="JOB", help="Job name (a directory under --root) or a state dir.")


def jobs_command(root: Path = _ROOT, json_out: bool = typer.Option(False, "--json", help="One JSON object.")) -> None:
    """List local runs: job, status (running, Succeeded, Failed, ended), step, state dir."""
    from rich.console import Console
    from rich.table import Table

    runs = find_runs(root)
    if json_out:
        typer.echo(json.dumps([{"job": r.name, "status": r.status, "state_dir": str(r.state_dir),
                                "step": r.summary.get("step")} for r in runs]))
        return
    if not runs:
        typer.echo(f"no local runs under {root}")
        return
    table = Table(box=None)
    for col in ("JOB", "STATUS", "STEP", "STARTED", "STATE DIR"):
        table.add_column(col)
    for r in runs:
        started = r.record.get("started_at")
        table.add_row(r.name, r.status, str(r.summary.get("step", "-")),
                      datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "-",
                      str(r.state_dir))
    Console().print(table)


def describe_command(job: str = _JOB, root: Path = _ROOT,
                     json_out: bool = typer.Option(False, "--json", help="One JSON object.")) -> None:
    """Show a local run: status, its record and summary, and every recorded process (alive or not)."""
    run = open_run(job, root)
    doc = {"job": run.name, "status": run.status, "state_dir": str(run.state_dir), "run": run.record,
           "summary": run.summary, "processes": run.processes}
    if json_out:
        typer.echo(json.dumps(doc, sort_keys=True, default=str))
        return
    from rich.console import Console

    from lifeline.launch.local_runs import _alive

    console = Console()
    console.print(f"[bold]{run.name}[/]  {run.status}  state dir {run.state_dir}")
    for key in ("spec", "ranks", "steps"):
        if key in run.record:
            console.print(f"  {key}: {run.record[key]}")
    for key in ("phase", "step", "steps", "wall_seconds", "ettr", "restarts"):
        if key in run.summary:
            console.print(f"  {key}: {run.summary[key]}")
    for name, pid in run.pids().items():
        console.print(f"  {name}: pid {pid} ({'alive' if _alive(pid) else 'exited'})")


def logs_command(
    job: str = _JOB, root: Path = _ROOT,
    rank: Optional[int] = typer.Option(None, "--rank", "-r", help="Only this rank."),
    role: Optional[str] = typer.Option(None, "--role", help="trainer or sidecar."),
    follow_: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the run ends."),
) -> None:
    """Print a local run's logs (every rank's trainer and sidecar, or those chosen), each line
    prefixed with its file when several are shown."""
    run = open_run(job, root)
    files = log_files(run, rank=rank, role=role)
    tag = len(files) > 1
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            typer.echo(f"{f.stem}| {line}" if tag else line)
    if follow_:
        try:
            for line in follow(files, until=lambda: not run.running):
                typer.echo(line)
        except KeyboardInterrupt:
            pass


def stop_command(job: str = _JOB, root: Path = _ROOT,
                 grace: float = typer.Option(30.0, "--grace", help="Seconds to wait for the run to stop.")) -> None:
    """Stop a local run: SIGTERM to its launcher, which stops every process and server it started;
    reports what is left (exit 1 if anything is)."""
    run = open_run(job, root)
    report = stop_run(run, grace=grace)
    if not report["stopped"] and not report["left"]:
        typer.echo(f"{run.name} is not running ({run.status})")
        return
    if report["left"]:
        typer.echo(f"{run.name}: still running after {report['seconds']} s: "
                   + ", ".join(f"{k} (pid {v})" for k, v in report["left"].items()), err=True)
        raise typer.Exit(code=1)
    typer.echo(f"stopped {run.name} (launcher pid {report['launcher']}) in {report['seconds']} s")
