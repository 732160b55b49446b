"""``lifeline devcluster up | down | status | kill-node | freeze-node | logs`` and the ``node`` role."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
node_app = typer.Typer(no_args_is_help=True)
