"""``lifeline run JOB.yaml``: run a TrainingJob spec on this machine as processes."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["run_command"]


def run_command(
    job: Path = typer.Argument(..., help="TrainingJob YAML (e.g. examples/gpt-moe.yaml)."),
    state_dir: Path = typer.Option(None, "--state-dir", help="Logs, arenas, Redis and MinIO data (MinIO serves s3:// L2 URIs). "
                                   "Default: .state/run/<job>. Run again with the same dir to resume from L2."),
    inject_failure: list[str] = typer.Option(None, "--inject-failure", help="KIND:rank=R:step=S with KIND trainer, "
                                             "sidecar, node (sidecar and trainer together) or hang (SIGSTOP "
                                             "the trainer). Repeatable."),
    steps: int = typer.Option(None, "--steps", help="Train this many steps instead of spec.steps."),
    persist_uri: str = typer.Option(None, "--persist-uri", help="L2 store instead of spec.checkpoint.persist.uri "
                                    "(s3://bucket/prefix, file:///path or a path)."),
    s3_endpoint: str = typer.Option("", "--s3-endpoint", help="host:port of an existing S3 endpoint for s3:// URIs "
                                    "(credentials from LIFELINE_S3_ACCESS_KEY/SECRET_KEY); default: start MinIO."),
    spare_nodes: int = typer.Option(None, "--spare-nodes", help="Local 'nodes' beyond one per rank for "
                                    "replacements (default: as many as ranks)."),
    slot_mib: int = typer.Option(64, "--slot-mib", help="Arena slot size per rank in MiB unless the template "
                                 "sets LIFELINE_SLOT_BYTES."),
    spares_per_node: int = typer.Option(1, "--spares-per-node", help="Pre-warmed trainer processes per rank's "
                                        "node, and sidecar + trainer pairs per standby node, that take over a "
                                        "failed container without Python/torch start-up (0: off)."),
    standby_nodes: int = typer.Option(1, "--standby-nodes", help="Free nodes that keep spares for replacements."),
    warm_start: bool = typer.Option(False, "--warm-start", help="Start the ranks only when every spare is ready "
                                    "(benchmarks, tests)."),
    timeout: float = typer.Option(None, "--timeout", help="Fail the run after this many seconds."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (no live display)."),
) -> None:
    """Run a TrainingJob spec on this machine: Redis, the L2 store, and per rank a sidecar and a
    trainer process, supervised with the operator's recovery logic (lifeline.control)."""
    import json
    import time

    from lifeline.launch.display import ProgressDisplay
    from lifeline.launch.inject import parse_injection
    from lifeline.launch.spec import load_for_launch
    from lifeline.launch.summary import summarize
    from lifeline.launch.supervisor import LaunchOptions, Supervisor

    spec = load_for_launch(job, steps=steps)
    world, total = spec.spec.layout.world_size, spec.spec.steps
    injections = tuple(parse_injection(text, world_size=world, steps=total) for text in inject_failure or ())
    options = LaunchOptions(
        state_dir=state_dir or Path(".state") / "run" / str(spec.name), injections=injections, persist_uri=persist_uri,
        s3_endpoint=s3_endpoint, spare_nodes=spare_nodes, slot_bytes=slot_mib << 20, timeout_seconds=timeout,
        spares_per_node=spares_per_node, standby_nodes=standby_nodes, warm_start=warm_start)
    import signal
    import sys

    # SIGTERM (e.g. `kill`) stops the run like Ctrl-C: every process and server started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    display = ProgressDisplay(enabled=not json_out)
    t0 = time.monotonic()
    with display:
        sup = Supervisor(spec, options, on_update=display.update)
        phase = sup.run()
    summary = summarize(sup, phase=phase, wall_seconds=time.monotonic() - t0, digest=sup.digest)
    if json_out:
        typer.echo(json.dumps(summary, sort_keys=True))
    else:
        _print_summary(summary)
    if phase != "Succeeded":
        raise typer.Exit(code=1)


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
        ("time lost to failures", f"{s['recovery_seconds']:.1f} s recovering; " + (
            "—" if s["lost_seconds"] is None else f"{s['lost_seconds']:.1f} s not on kept steps (start-up included)")),
        ("ETTR", "—" if s["ettr"] is None else f"{s['ettr']:.3f}"),
        ("recoveries", "; ".join(f"gen {r['generation']} {r['action']} from step {r['from_step']} to "
                                 f"{r['restore_step']} ({r['tier']}, {r['seconds']} s)" for r in s["recoveries"])
         or "none"),
        ("final loss", "—" if s["final_loss"] is None else f"{s['final_loss']:.4f}"),
        ("digest", "—" if not s["digest"] else f"{s['digest']['sha256'][:16]}… ({s['digest']['source']}, "
                                                f"step {s['digest']['step']})"),
        ("state dir", s["state_dir"]),
    ]
    for k, v in rows:
        table.add_row(k, v)
    Console(stderr=False).print(table)
