"""The ``lifeline`` command line: one entry point dispatching to every role.

Each part owns its sub-command in its own ``cli`` module; this module only wires them
together. Heavy imports (torch) happen inside commands, never at import time, so
``lifeline --help`` stays fast.
"""

from __future__ import annotations

import sys

import typer

from lifeline.errors import LifelineError

app = typer.Typer(
    name="lifeline",
    help="Fault-tolerant training on Kubernetes. Roles: devcluster, ckpt, run, bench, "
    "sidecar, trainer, operator, node.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from lifeline.bench.cli import app as bench_app
    from lifeline.checkpoint.cli import app as ckpt_app
    from lifeline.devcluster.cli import app as devcluster_app
    from lifeline.devcluster.cli import node_app
    from lifeline.launch.cli import run_command
    from lifeline.operator.cli import operator_command
    from lifeline.models.cli import trainer_command
    from lifeline.sidecar.cli import sidecar_command

    app.add_typer(devcluster_app, name="devcluster", help="A real Kubernetes control plane with process nodes.")
    app.add_typer(node_app, name="node", help="(role) A dev-cluster process node agent.")
    app.add_typer(ckpt_app, name="ckpt", help="Inspect, verify and export checkpoints.")
    app.add_typer(bench_app, name="bench", help="Benchmarks: one JSON object per run.")
    app.command("run", help="Run a TrainingJob spec on this machine as processes.")(run_command)
    app.command("sidecar", help="(role) The checkpoint sidecar (software DPU).")(sidecar_command)
    app.command("trainer", help="(role) Run a reference trainer under the Lifeline runtime.")(trainer_command)
    app.command("operator", help="(role) The TrainingJob operator (kopf).")(operator_command)


_register()


def main() -> None:
    """Run the CLI; a :class:`LifelineError` prints one clear line and exits 2."""
    try:
        app()
    except LifelineError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
