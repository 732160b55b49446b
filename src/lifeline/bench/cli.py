"""``lifeline bench <name>``: benchmarks print one JSON object with every peer measured in the same run."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
