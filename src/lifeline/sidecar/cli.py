"""``python -m lifeline sidecar``."""

from __future__ import annotations

import typer


def sidecar_command() -> None:
    """Run the checkpoint sidecar."""
    typer.echo("lifeline sidecar: not implemented yet", err=True)
    raise typer.Exit(code=3)
