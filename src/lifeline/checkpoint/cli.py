"""``lifeline ckpt ls | show | verify | export``."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
