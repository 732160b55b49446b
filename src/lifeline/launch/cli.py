"""``lifeline run JOB.yaml``."""

from __future__ import annotations

from pathlib import Path

import typer


def run_command(job: Path = typer.Argument(..., help="TrainingJob YAML")) -> None:
    """Run a TrainingJob spec on this machine as processes."""
    raise typer.Exit(code=_not_yet("run"))


def _not_yet(what: str) -> int:
    typer.echo(f"lifeline {what}: not implemented yet", err=True)
    return 3
