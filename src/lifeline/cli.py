"""The ``lifeline`` command line: one entry point dispatching to every role.

Each part owns its sub-commands in its own ``cli`` module; this module only wires them
together and owns the one error path: a :class:`~lifeline.errors.LifelineError` or a usage
error (unknown option, bad value) prints one line ``error: ...`` on stderr and exits 2;
``--debug`` (anywhere on the line, or ``LIFELINE_DEBUG=1``) shows the traceback too. Heavy
imports (torch) happen inside commands, never at import time, so ``lifeline --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
import traceback
from importlib.metadata import PackageNotFoundError, version

import typer
from typer._click import exceptions as click_exc

from lifeline.errors import LifelineError

__all__ = ["app", "main", "USER_PANEL", "ROLE_PANEL"]

USER_PANEL = "Commands"
ROLE_PANEL = "Internal roles (run inside pods and by lifeline run)"

app = typer.Typer(
    name="lifeline",
    help="Fault-tolerant training on Kubernetes: run a TrainingJob here (run), check it (validate), "
    "manage local runs (jobs, describe, logs, stop) and checkpoints (ckpt).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _plain_help() -> None:
    """Help as users read it: a plain flag shows no ``<bool>`` value, a repeatable option says so, a
    required argument shows as ``JOB.yaml`` rather than ``{JOB.yaml}`` in the usage line. (Typer has no
    setting for these; its two display hooks are wrapped, here only.)"""
    from typer.core import TyperArgument, TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx):  # type: ignore[no-untyped-def]
        if self.is_flag:
            return None
        text = shown(self, ctx)
        return f"{text} (repeatable)" if self.multiple and text else text

    def usage_name(self: TyperArgument) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


_plain_help()


def _version() -> str:
    try:
        return version("lifeline")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"lifeline {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                      help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show a traceback with errors (also LIFELINE_DEBUG=1)."),
) -> None:
    """Fault-tolerant training on Kubernetes."""


def _register() -> None:
    from lifeline.bench.cli import app as bench_app
    from lifeline.checkpoint.cli import app as ckpt_app
    from lifeline.devcluster.cli import app as devcluster_app
    from lifeline.devcluster.cli import node_app
    from lifeline.kindbed.cli import app as kind_app
    from lifeline.launch.cli import register as register_launch
    from lifeline.models.cli import densify_command, trainer_command
    from lifeline.operator.cli import operator_command
    from lifeline.sidecar.cli import sidecar_command

    register_launch(app, panel=USER_PANEL)
    ckpt_app.command("densify")(densify_command)  # runs the model: registered here, above the checkpoint part
    app.add_typer(ckpt_app, name="ckpt", help="Inspect, verify, export, import, densify and delete checkpoints.",
                  rich_help_panel=USER_PANEL)
    app.add_typer(bench_app, name="bench", help="Benchmarks: one JSON object per run.", rich_help_panel=USER_PANEL)
    app.add_typer(devcluster_app, name="devcluster", help="A real Kubernetes control plane with process nodes.",
                  rich_help_panel=USER_PANEL)
    app.add_typer(kind_app, name="kind", help="The kind test bed: node and service images built here, kind from source.",
                  rich_help_panel=USER_PANEL)
    app.command("sidecar", help="The checkpoint sidecar (software DPU).", rich_help_panel=ROLE_PANEL)(sidecar_command)
    app.command("trainer", help="Run a reference trainer under the Lifeline runtime.",
                rich_help_panel=ROLE_PANEL)(trainer_command)
    app.command("operator", help="The TrainingJob operator (kopf).", rich_help_panel=ROLE_PANEL)(operator_command)
    app.add_typer(node_app, name="node", help="A dev-cluster process node agent.", rich_help_panel=ROLE_PANEL)


_register()


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _usage_line(err: click_exc.UsageError) -> str:
    where = err.ctx.command_path if err.ctx is not None else "lifeline"
    return f"{where}: {_one_line(err.format_message())} (see {where} --help)"


def main(argv: list[str] | None = None) -> None:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and exit with its status.

    A :class:`LifelineError` or a usage error prints one line ``error: ...`` on stderr and exits 2;
    an unexpected exception prints one line and exits 1; ``--debug`` adds the traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("LIFELINE_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    try:
        code = app(args=args, prog_name="lifeline", standalone_mode=False)
    except click_exc.NoArgsIsHelpError:
        code = 0  # the help was printed
    except click_exc.UsageError as err:
        _fail(_usage_line(err), 2, debug)
    except LifelineError as err:
        _fail(_one_line(str(err)), 2, debug)
    except typer.Abort:
        _fail("aborted", 130, debug)
    except KeyboardInterrupt:
        _fail("interrupted", 130, debug)
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, no traceback
        _fail(f"{type(err).__name__}: {_one_line(str(err))} (a bug: run again with --debug and report the "
              "traceback)", 1, debug)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(line: str, code: int, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    print(f"error: {line}", file=sys.stderr)
    sys.exit(code)
