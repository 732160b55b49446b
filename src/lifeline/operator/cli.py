"""``python -m lifeline operator``."""

from __future__ import annotations

import typer


def operator_command() -> None:
    """Run the TrainingJob operator."""
    typer.echo("lifeline operator: not implemented yet", err=True)
    raise typer.Exit(code=3)
