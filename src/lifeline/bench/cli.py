"""``lifeline bench <name>``: benchmarks print one JSON object with every peer measured in the same run."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("checkpoint")
def checkpoint_command(
    size_mib: int = typer.Option(256, "--size-mib", help="State size in MiB (float32 tensors)."),
    tensors: int = typer.Option(128, "--tensors", help="Number of tensors (float32, each rows x 1024)."),
    repeats: int = typer.Option(5, "--repeats", help="Repeats per row (the median is reported)."),
    minio: bool = typer.Option(True, "--minio/--no-minio", help="Also measure on a MinIO server started here."),
    reshard_from: int = typer.Option(4, "--reshard-from", help="Ranks saving (reshard row)."),
    reshard_to: int = typer.Option(2, "--reshard-to", help="Ranks loading (reshard row)."),
    workdir: str = typer.Option(None, "--workdir", help="Directory for the files (default: the temp dir)."),
) -> None:
    """Our checkpoint format vs torch.distributed.checkpoint vs torch.save: save, load, reshard, raw storage."""
    import json

    from lifeline.bench.checkpoint import run

    typer.echo(json.dumps(run(size_mib=size_mib, tensors=tensors, repeats=repeats, minio=minio,
                              reshard_from=reshard_from, reshard_to=reshard_to, workdir=workdir), indent=1))


@app.command("sidecar")
def sidecar_command(
    sizes: str = typer.Option("256MiB,1GiB", "--sizes", help="Comma-separated state sizes, e.g. 64MiB,1GiB."),
    reps: int = typer.Option(3, "--reps", help="Repetitions per measurement after warm-up (median reported; "
                             "the replication run warms up with two saves)."),
) -> None:
    """Sidecar trainer stall, replication and persistence vs memcpy, torch.save, DCP, DLRover, TCP and minio."""
    import json

    from lifeline.bench.sidecar import parse_size, run_bench

    try:
        parsed = [parse_size(s) for s in sizes.split(",") if s.strip()]
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--sizes") from None
    typer.echo(json.dumps(run_bench(parsed, reps=reps), indent=1))


@app.command("recovery")
def recovery_command(
    steps: int = typer.Option(40, "--steps", help="Steps of the recovery runs."),
    persist_every: int = typer.Option(10, "--persist-every", help="L2 and DCP checkpoint interval (steps)."),
    fail_step: int = typer.Option(15, "--fail-step", help="Step of the first injected failure (the second: +4)."),
    duration: float = typer.Option(1800.0, "--duration", help="ETTR run: seconds of training (30 min by default)."),
    mtbf: float = typer.Option(180.0, "--mtbf", help="ETTR run: mean time between failures, seconds."),
    ettr: bool = typer.Option(True, "--ettr/--no-ettr", help="Also run the ETTR row."),
    workdir: str = typer.Option(None, "--workdir", help="Directory for state and logs (default: a new temp dir)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the ETTR run's failure times and ranks."),
) -> None:
    """Recovery time and steps lost: in-place restart (L0), replacement (L1), restart-all from DCP in MinIO; ETTR."""
    import json

    from lifeline.bench.recovery import run

    typer.echo(json.dumps(run(steps=steps, persist_every=persist_every, fail_step=fail_step, duration=duration,
                              mtbf=mtbf, ettr=ettr, workdir=workdir, seed=seed), indent=1))


@app.command("operator")
def operator_command(
    steps: int = typer.Option(60, "--steps", help="spec.steps of the TrainingJob."),
    kill_after_step: int = typer.Option(10, "--kill-after-step", help="Kill rank 1's node once this step is complete."),
    poll: float = typer.Option(0.1, "--poll", help="Seconds between API reads (timestamp resolution)."),
    workdir: str = typer.Option(None, "--workdir", help="Dev cluster state directory (default: a new temp dir)."),
) -> None:
    """The operator on a real dev cluster: a node killed mid-run; detection, replacement, resume, reconcile latency."""
    import json

    from lifeline.bench.operator import run

    typer.echo(json.dumps(run(steps=steps, kill_after_step=kill_after_step, workdir=workdir, poll=poll), indent=1))
