"""``lifeline run JOB.yaml`` and ``lifeline validate JOB.yaml`` (and the local-run commands of
:mod:`lifeline.launch.local_cli`): run a TrainingJob spec on this machine as processes.

Everything is checked (:func:`lifeline.launch.preflight.check_run`) before anything starts."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer

__all__ = ["run_command", "validate_command", "register"]

_INJECT_HELP = ("KIND:rank=R:step=S, KIND one of trainer, sidecar, node (sidecar and trainer together), hang "
                "(SIGSTOP the trainer), flip (add tier=L0|L1|L2: a byte of a copy, then the failure that reads "
                "it), preempt (seconds=G, default 10: SIGTERM, SIGKILL after G s, node lost), redis:step=S "
                "(restart it empty), minio:step=S[:seconds=D] (an outage), nan (add transient=1 for the first try "
                "only: the rank's step numbers turn NaN; docs/numerics.md), slow (factor=F, default 2: the rank's node "
                "computes F times slower from step S; docs/stragglers.md); any but nan and slow may add "
                ":when=recovery (fire during a recovery). Repeat the flag for several failures.")


def register(app: typer.Typer, *, panel: str) -> None:
    """Add ``run``, ``validate``, ``jobs``, ``describe``, ``logs`` and ``stop`` to ``app`` under ``panel``."""
    from lifeline.launch.local_cli import describe_command, jobs_command, logs_command, stop_command

    app.command("run", help="Run a TrainingJob spec on this machine as processes.", rich_help_panel=panel)(run_command)
    app.command("validate", help="Check a TrainingJob spec as the API server and run would, starting nothing.",
                rich_help_panel=panel)(validate_command)
    app.command("jobs", help="List local runs (state dirs) and whether they are running.",
                rich_help_panel=panel)(jobs_command)
    app.command("describe", help="Show a local run: its summary and processes.", rich_help_panel=panel)(describe_command)
    app.command("logs", help="Print a local run's logs (a rank, a role; -f follows).", rich_help_panel=panel)(logs_command)
    app.command("stop", help="Stop a local run (SIGTERM to its launcher).", rich_help_panel=panel)(stop_command)


def run_command(
    job: Path = typer.Argument(..., metavar="JOB.yaml", help="TrainingJob YAML (e.g. examples/gpt-moe.yaml)."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Logs, arenas, Redis and MinIO data. Default: "
                                             ".state/run/<job>. Run again with the same dir to resume from L2."),
    inject_failure: Optional[list[str]] = typer.Option(None, "--inject-failure", metavar="KIND:rank=R:step=S",
                                                       help=_INJECT_HELP),
    steps: Optional[int] = typer.Option(None, "--steps", help="Train this many steps instead of spec.steps."),
    persist_uri: Optional[str] = typer.Option(None, "--persist-uri", help="L2 store instead of spec.checkpoint."
                                              "persist.uri (s3://bucket/prefix, file:///path or a path)."),
    s3_endpoint: str = typer.Option("", "--s3-endpoint", envvar="LIFELINE_S3_ENDPOINT", show_default=False,
                                    help="host:port of an existing S3 endpoint for s3:// URIs (credentials: "
                                    "LIFELINE_S3_ACCESS_KEY, LIFELINE_S3_SECRET_KEY); default: start MinIO here."),
    spare_nodes: Optional[int] = typer.Option(None, "--spare-nodes", help="Local 'nodes' beyond one per rank for "
                                              "replacements (default: as many as ranks)."),
    slot_mib: int = typer.Option(64, "--slot-mib", help="Arena slot size per rank in MiB unless the template "
                                 "sets LIFELINE_SLOT_BYTES."),
    spares_per_node: int = typer.Option(1, "--spares-per-node", help="Pre-warmed trainer processes per rank's "
                                        "node, and sidecar + trainer pairs per standby node (0: off)."),
    standby_nodes: int = typer.Option(1, "--standby-nodes", help="Free nodes that keep spares for replacements."),
    warm_start: bool = typer.Option(False, "--warm-start", help="Start the ranks only when every spare is ready "
                                    "(benchmarks, tests)."),
    fresh_processes: bool = typer.Option(False, "--fresh-processes", help="Start every rank process as a fresh "
                                         "interpreter, as a container does (default: fork them from a template "
                                         "process per role that imported torch once)."),
    node_return_seconds: Optional[float] = typer.Option(
        None, "--node-return-seconds", help="A lost node is Ready again after this many seconds (> 0; an elastic "
        "job then grows back to its size). Default: lost for good."),
    unhealthy_node: Optional[list[str]] = typer.Option(
        None, "--unhealthy-node", metavar="NODE:KIND[:rejoin]", help="Make NODE (node-<i>) fail its health "
        "check before start (with :rejoin, the check when it comes back after a loss): KIND compute (a wrong "
        "matmul result), slow (4x its compute) or network (a slow all-reduce). Needs "
        "spec.recovery.healthCheck.enabled."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Fail the run after this many seconds (> 0)."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (no live display)."),
) -> None:
    """Run a TrainingJob spec on this machine: Redis, the L2 store, and per rank a sidecar and a
    trainer process, supervised with the operator's recovery logic (lifeline.control). Every input is
    checked first; the summary is also written to STATE_DIR/summary.json."""
    from lifeline.launch.preflight import check_run

    plan = check_run(job, steps=steps, state_dir=state_dir, inject=inject_failure or (), persist_uri=persist_uri,
                     s3_endpoint=s3_endpoint, spare_nodes=spare_nodes, slot_mib=slot_mib,
                     spares_per_node=spares_per_node, standby_nodes=standby_nodes, timeout=timeout,
                     node_return_seconds=node_return_seconds, unhealthy=unhealthy_node or ())
    from lifeline.launch.display import ProgressDisplay
    from lifeline.launch.local_runs import write_run_record, write_summary
    from lifeline.launch.services import prepare_binaries
    from lifeline.launch.summary import summarize
    from lifeline.launch.supervisor import LaunchOptions, Supervisor

    options = LaunchOptions(
        state_dir=plan.state_dir, injections=plan.injections, persist_uri=persist_uri, s3_endpoint=s3_endpoint,
        spare_nodes=spare_nodes, slot_bytes=slot_mib << 20, timeout_seconds=timeout,
        spares_per_node=spares_per_node, standby_nodes=standby_nodes, warm_start=warm_start,
        node_return_seconds=node_return_seconds, templates=not fresh_processes, unhealthy_nodes=plan.unhealthy)
    # SIGTERM (e.g. `kill`, `lifeline stop`) stops the run like Ctrl-C: every process and server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    display = ProgressDisplay(enabled=not json_out)
    build_seconds = prepare_binaries(plan.job, persist_uri=persist_uri, s3_endpoint=s3_endpoint)
    t0 = time.monotonic()  # the wall time leaves building MinIO (first run on a machine) out
    recorded = []

    def update(snapshot) -> None:
        if not recorded and plan.state_dir.is_dir():
            write_run_record(plan.state_dir, plan.job, spec_path=job)
            recorded.append(True)
        display.update(snapshot)

    with display:
        sup = Supervisor(plan.job, options, on_update=update)
        phase = sup.run()
    summary = summarize(sup, phase=phase, wall_seconds=time.monotonic() - t0, digest=sup.digest)
    summary["build_seconds"] = round(build_seconds, 3)
    write_summary(plan.state_dir, summary)
    if json_out:
        typer.echo(json.dumps(summary, sort_keys=True))
    else:
        _print_summary(summary)
    if phase != "Succeeded":
        raise typer.Exit(code=1)


def validate_command(
    job: Path = typer.Argument(..., metavar="JOB.yaml", help="TrainingJob YAML."),
) -> None:
    """Check JOB.yaml as the API server would (schema, CEL rules, the name) and as lifeline run would
    (the trainer command, the model's arguments and layout, the L2 URI, this machine's cores and
    memory), starting nothing. Exit 0 with one line 'ok: ...', or exit 2 with every problem on one line."""
    from lifeline.launch.preflight import check_run

    plan = check_run(job)
    spec = plan.job.spec
    lay = spec.layout
    l2 = spec.checkpoint.persist.uri if spec.checkpoint.persist else "none"
    typer.echo(f"ok: {job}: TrainingJob {plan.job.name}, {lay.world_size} ranks (tensor {lay.tensor} x pipeline "
               f"{lay.pipeline} x data {lay.data} x expert {lay.expert}), {spec.steps} steps, L2 {l2}")


def _print_summary(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{s['job']}: {s['phase']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("steps", f"{s['step']} / {s['steps']}" + (f" (resumed from L2 step {s['resumed_from']})"
                                                   if s["resumed_from"] is not None else "")),
        ("wall time", f"{s['wall_seconds']:.1f} s"),
        ("time lost to failures", f"{s['time_lost_seconds']:.1f} s from the faults to the same step "
         f"({s['recovery_seconds']:.1f} s of it until training resumed, detection included); " + (
            "—" if s["lost_seconds"] is None else f"{s['lost_seconds']:.1f} s not on kept steps (start-up included)")),
        ("ETTR", "—" if s["ettr"] is None else f"{s['ettr']:.3f}"),
        ("recoveries", "; ".join(f"gen {r['generation']} {r['action']} from step {r['from_step']} to "
                                 f"{r['restore_step']} ({r['tier']}, {r['to_same_step_seconds']} s from the fault "
                                 f"to the same step)" for r in s["recoveries"]) or "none"),
        ("final loss", "—" if s["final_loss"] is None else f"{s['final_loss']:.4f}"),
        ("digest", "—" if not s["digest"] else f"{s['digest']['sha256'][:16]}… ({s['digest']['source']}, "
                                                f"step {s['digest']['step']})"),
        ("state dir", s["state_dir"]),
    ]
    for k, v in rows:
        table.add_row(k, v)
    Console(stderr=False).print(table)
