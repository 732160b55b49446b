"""``python -m lifeline trainer``."""

from __future__ import annotations

import typer


def trainer_command() -> None:
    """Run a reference trainer under the Lifeline runtime."""
    typer.echo("lifeline trainer: not implemented yet", err=True)
    raise typer.Exit(code=3)
