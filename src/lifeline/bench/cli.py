"""``lifeline bench <name>``: benchmarks print one JSON object with every peer measured in the same run.

Every benchmark takes ``--repeats`` (where it repeats) and ``--state-dir`` (where it keeps files);
bad values are one :class:`~lifeline.errors.ConfigError` naming the flag, before anything runs.
``bench recovery``'s 30-minute ETTR row is opt-in (``--ettr``); ``bench crash`` counts torn checkpoints after
random SIGKILLs of savers and sidecars; ``bench reshard`` times a change of layout from memory, from L2 and
with DCP; ``bench chaos`` runs jobs under seeded random faults."""

from __future__ import annotations

from pathlib import Path

import typer

from lifeline.errors import ConfigError

app = typer.Typer(no_args_is_help=True)


def _check(*rules: tuple[bool, str, str], state_dir: str | None = None) -> None:
    """Raise one :class:`ConfigError` listing every ``(bad, flag, message)`` whose ``bad`` is true."""
    problems = [(flag, f"{flag} {msg}") for bad, flag, msg in rules if bad]
    if state_dir is not None and Path(state_dir).exists() and not Path(state_dir).is_dir():
        problems.append(("--state-dir", f"--state-dir {state_dir} is not a directory"))
    if problems:
        raise ConfigError("; ".join(m for _, m in problems), field=problems[0][0])


def _state_dir(help_text: str):
    return typer.Option(None, "--state-dir", help=help_text)


@app.command("checkpoint")
def checkpoint_command(
    size_mib: int = typer.Option(256, "--size-mib", help="State size in MiB (float32 tensors)."),
    tensors: int = typer.Option(128, "--tensors", help="Number of tensors (float32, each rows x 1024)."),
    repeats: int = typer.Option(5, "--repeats", help="Repeats per row (the median is reported)."),
    minio: bool = typer.Option(True, "--minio/--no-minio", help="Also measure on a MinIO server started here."),
    reshard_from: int = typer.Option(4, "--reshard-from", help="Ranks saving (reshard row)."),
    reshard_to: int = typer.Option(2, "--reshard-to", help="Ranks loading (reshard row)."),
    state_dir: str = _state_dir("Directory for the files (default: the temp dir)."),
    model: str = typer.Option("synthetic", "--model", help="synthetic: the rows above; fsdp2: a fully_shard "
                              "model + AdamW at world size 2 (stall vs memcpy and DCP async_save; reshard reads)."),
) -> None:
    """Our checkpoint format vs torch.distributed.checkpoint vs torch.save: save, load, reshard, raw storage."""
    import json

    _check((size_mib < 1, "--size-mib", f"must be >= 1, got {size_mib}"),
           (tensors < 1, "--tensors", f"must be >= 1, got {tensors}"),
           (repeats < 1, "--repeats", f"must be >= 1, got {repeats}"),
           (reshard_from < 1, "--reshard-from", f"must be >= 1, got {reshard_from}"),
           (reshard_to < 1, "--reshard-to", f"must be >= 1, got {reshard_to}"),
           (model not in ("synthetic", "fsdp2"), "--model", f"must be synthetic or fsdp2, got {model!r}"),
           state_dir=state_dir)

    from lifeline.bench.checkpoint import run, run_fsdp2

    if model == "fsdp2":
        typer.echo(json.dumps(run_fsdp2(repeats=repeats, workdir=state_dir), indent=1))
        return

    typer.echo(json.dumps(run(size_mib=size_mib, tensors=tensors, repeats=repeats, minio=minio,
                              reshard_from=reshard_from, reshard_to=reshard_to, workdir=state_dir), indent=1))


@app.command("sidecar")
def sidecar_command(
    sizes: str = typer.Option("256MiB,1GiB", "--sizes", help="Comma-separated state sizes, e.g. 64MiB,1GiB."),
    repeats: int = typer.Option(3, "--repeats", help="Repetitions per measurement after warm-up (median "
                                "reported; the replication run warms up with two saves)."),
) -> None:
    """Sidecar trainer stall, replication and persistence vs memcpy, torch.save, DCP, DLRover, TCP and minio."""
    import json

    from lifeline.bench.sidecar import parse_size, run_bench

    try:
        parsed = [parse_size(s) for s in sizes.split(",") if s.strip()]
    except ValueError as err:
        raise ConfigError(f"--sizes {sizes!r}: {err}; write e.g. 64MiB,1GiB", field="--sizes") from None
    _check((not parsed, "--sizes", "is empty; write e.g. 64MiB,1GiB"),
           (repeats < 1, "--repeats", f"must be >= 1, got {repeats}"))
    typer.echo(json.dumps(run_bench(parsed, reps=repeats), indent=1))


@app.command("recovery")
def recovery_command(
    steps: int = typer.Option(40, "--steps", help="Steps of the recovery runs."),
    persist_every: int = typer.Option(10, "--persist-every", help="L2 and DCP checkpoint interval (steps)."),
    fail_step: int = typer.Option(15, "--fail-step", help="Step of the first injected failure (the second: +4)."),
    duration: float = typer.Option(1800.0, "--duration", help="ETTR run: seconds of training (30 min by default)."),
    mtbf: float = typer.Option(180.0, "--mtbf", help="ETTR run: mean time between failures, seconds."),
    ettr: bool = typer.Option(False, "--ettr", help="Also run the ETTR row (--duration seconds: 30 min by default)."),
    state_dir: str = _state_dir("Directory for state and logs (default: a new temp dir)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the ETTR run's failure times and ranks."),
) -> None:
    """Recovery time and steps lost: in-place restart (L0), replacement (L1), restart-all from DCP in MinIO; ETTR."""
    import json

    _check((steps < 4, "--steps", f"must be >= 4, got {steps}"),
           (persist_every < 1, "--persist-every", f"must be >= 1, got {persist_every}"),
           (not 1 <= fail_step < steps - 4, "--fail-step", f"must be in [1, --steps - 4) = [1, {steps - 4}) (a second "
            f"failure follows at +4), got {fail_step}"),
           (not duration > 0, "--duration", f"must be > 0 seconds, got {duration:g}"),
           (not mtbf > 0, "--mtbf", f"must be > 0 seconds, got {mtbf:g}"), state_dir=state_dir)
    from lifeline.bench.recovery import run

    typer.echo(json.dumps(run(steps=steps, persist_every=persist_every, fail_step=fail_step, duration=duration,
                              mtbf=mtbf, ettr=ettr, workdir=state_dir, seed=seed), indent=1))


@app.command("operator")
def operator_command(
    steps: int = typer.Option(60, "--steps", help="spec.steps of the TrainingJob."),
    kill_after_step: int = typer.Option(10, "--kill-after-step", help="Kill rank 1's node once this step is complete."),
    poll: float = typer.Option(0.1, "--poll", help="Seconds between API reads (timestamp resolution)."),
    cluster: str = typer.Option("kind", "--cluster", help="kind (real kubelets, images built here) or dev "
                                "(process nodes)."),
    state_dir: str = _state_dir("Cluster state directory (default: a new temp dir)."),
) -> None:
    """The operator on a real cluster: a node killed mid-run; detection, replacement, resume, reconcile latency."""
    import json

    _check((cluster not in ("kind", "dev"), "--cluster", f"must be kind or dev, got {cluster!r}"),
           (steps < 2, "--steps", f"must be >= 2, got {steps}"),
           (not 1 <= kill_after_step < steps, "--kill-after-step", f"must be in [1, --steps), got {kill_after_step}"),
           (not poll > 0, "--poll", f"must be > 0 seconds, got {poll:g}"), state_dir=state_dir)
    from lifeline.bench.operator import run

    typer.echo(json.dumps(run(steps=steps, kill_after_step=kill_after_step, workdir=state_dir, poll=poll,
                              cluster=cluster), indent=1))


@app.command("moe")
def moe_command(
    experts: str = typer.Option("8,32,64", "--experts", help="Comma-separated experts per MoE layer."),
    steps: int = typer.Option(12, "--steps", help="spec.steps of the recovery runs."),
    fail_step: int = typer.Option(7, "--fail-step", help="Kill the middle stage's trainer at this step."),
    every: int = typer.Option(4, "--every", help="Checkpoint interval of the recovery runs (steps)."),
    recovery: bool = typer.Option(True, "--recovery/--no-recovery", help="Run the two recovery runs."),
    state_dir: str = _state_dir("Directory for the runs (default: a new temp dir)."),
    model: str = typer.Option("gpt-moe", "--model",
                              help="gpt-moe (the reference trainer) or pipelining-moe (examples/pipelining-moe)."),
    compute_dtype: str = typer.Option("bfloat16", "--compute-dtype", help="The checkpoint rows' model compute "
                                      "dtype, which FROZEN copies are stored in: bfloat16 or float32."),
) -> None:
    """MoE: checkpoint bytes and stall per step (dense vs sparse), upstream-log bytes, localized vs global
    recovery of one stage, and ETTR at scale next to CheckFreq, Gemini and MoEvement."""
    import json

    try:
        counts = tuple(int(x) for x in experts.split(",") if x.strip())
    except ValueError:
        counts = ()
    _check((not counts or min(counts) < 2, "--experts", f"must be integers >= 2 separated by commas, got {experts!r}"),
           (steps < 3, "--steps", f"must be >= 3, got {steps}"),
           (every < 1, "--every", f"must be >= 1, got {every}"),
           (not every < fail_step < steps, "--fail-step", f"must be in (--every, --steps), got {fail_step}"),
           (model not in ("gpt-moe", "pipelining-moe"), "--model", f"must be gpt-moe or pipelining-moe, got {model!r}"),
           (compute_dtype not in ("bfloat16", "float32"), "--compute-dtype",
            f"must be bfloat16 or float32, got {compute_dtype!r}"),
           state_dir=state_dir)
    from lifeline.bench.moe import run

    typer.echo(json.dumps(run(experts=counts, steps=steps, fail_step=fail_step, every=every, recovery=recovery,
                              workdir=state_dir, model=model, compute_dtype=compute_dtype), indent=1))


@app.command("crash")
def crash_command(
    trials: int = typer.Option(None, "--trials", help="Kill trials of every target (overrides the three below)."),
    trials_fs: int = typer.Option(400, "--trials-fs", help="Kill trials of a FilesystemStorage saver."),
    trials_s3: int = typer.Option(300, "--trials-s3", help="Kill trials of a saver uploading to MinIO."),
    trials_sidecar: int = typer.Option(300, "--trials-sidecar", help="Kill trials of a sidecar persisting to MinIO."),
    seed: int = typer.Option(0, "--seed", help="Seed of the kill times, ranks and states (a run replays)."),
    state_dir: str = _state_dir("Directory for the files and MinIO (default: a new temp dir, removed)."),
) -> None:
    """SIGKILL savers (fs, MinIO) and sidecars at random moments of a save; count torn checkpoints visible."""
    import json

    counts = {"fs": trials_fs, "s3": trials_s3, "sidecar": trials_sidecar}
    if trials is not None:
        counts = dict.fromkeys(counts, trials)
    _check(*((n < 0, f"--trials-{k}" if trials is None else "--trials", f"must be >= 0, got {n}")
             for k, n in counts.items()),
           (sum(counts.values()) < 1, "--trials", "leaves no trial to run; give at least one"), state_dir=state_dir)
    from lifeline.bench.crash import run

    typer.echo(json.dumps(run(trials=counts, seed=seed, workdir=state_dir), indent=1))


@app.command("chaos")
def chaos_command(
    trials: int = typer.Option(50, "--trials", help="Chaos trials (trial i has seed SEED + i)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the first trial's fault schedule (--trials 1 replays one)."),
    steps: int = typer.Option(None, "--steps", help="spec.steps of every trial, a multiple of --persist-every "
                              "(default 12 locally, 48 on the dev cluster)."),
    persist_every: int = typer.Option(None, "--persist-every", help="L2 checkpoint interval in steps (default 4 "
                                      "locally, 8 on the dev cluster)."),
    pipeline: int = typer.Option(2, "--pipeline", help="Pipeline degree of the trials' layout."),
    data: int = typer.Option(1, "--data", help="Data degree of the trials' layout."),
    max_faults: int = typer.Option(2, "--max-faults", help="Faults drawn per trial (1..N), plus possibly one "
                                   "during a recovery."),
    faults: str = typer.Option("trainer,sidecar,node,hang,redis,minio,flip:L0,flip:L1,flip:L2", "--faults",
                               help="Comma-separated faults to draw from."),
    bed: str = typer.Option("local", "--bed", help="local (lifeline run) or devcluster (the process-node "
                            "Kubernetes dev cluster, with operator kills)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the state dirs of passed trials too."),
    spares_per_node: int = typer.Option(0, "--spares-per-node", help="lifeline run's pre-warmed spares per node "
                                        "(default 0: every restart is a fresh process)."),
    reference: bool = typer.Option(True, "--reference/--no-reference", help="Run the failure-free reference "
                                   "(the digest check needs it)."),
    state_dir: str = _state_dir("Directory for the trials (default: a new temp dir; failed trials are kept)."),
) -> None:
    """Jobs under seeded random faults (kills, hangs, node loss, Redis and MinIO outages, flipped bytes in
    L0/L1/L2, faults during recoveries): finished, bit-identical, nothing torn, every corruption detected."""
    import json

    from lifeline.bench._chaos_schedule import FAULTS

    drawn = tuple(f.strip() for f in faults.split(",") if f.strip())
    cluster = bed == "devcluster"
    steps = steps if steps is not None else (48 if cluster else 12)
    persist_every = persist_every if persist_every is not None else (8 if cluster else 4)
    _check((trials < 1, "--trials", f"must be >= 1, got {trials}"),
           (seed < 0, "--seed", f"must be >= 0, got {seed}"),
           (persist_every < 1, "--persist-every", f"must be >= 1, got {persist_every}"),
           (steps < 6 or steps % max(persist_every, 1) != 0, "--steps",
            f"must be >= 6 and a multiple of --persist-every ({persist_every}), got {steps}"),
           (pipeline < 1 or data < 1 or pipeline * data < 2, "--pipeline",
            f"--pipeline x --data must be >= 2 ranks, got {pipeline} x {data}"),
           (max_faults < 1, "--max-faults", f"must be >= 1, got {max_faults}"),
           (not drawn or any(f not in FAULTS for f in drawn), "--faults",
            f"must name faults among {', '.join(FAULTS)}, got {faults!r}"),
           (bed not in ("local", "devcluster"), "--bed", f"must be local or devcluster, got {bed!r}"),
           (spares_per_node < 0, "--spares-per-node", f"must be >= 0, got {spares_per_node}"), state_dir=state_dir)
    if bed == "devcluster":
        from lifeline.bench.chaos_cluster import run as run_cluster

        typer.echo(json.dumps(run_cluster(trials=trials, seed=seed, workdir=state_dir, keep=keep, max_faults=max_faults,
                                          steps=steps, persist_every=persist_every), indent=1))
        return
    from lifeline.bench.chaos import run

    typer.echo(json.dumps(run(trials=trials, seed=seed, steps=steps, persist_every=persist_every, pipeline=pipeline,
                              data=data, max_faults=max_faults, faults=drawn, workdir=state_dir, keep=keep,
                              reference=reference, spares_per_node=spares_per_node), indent=1))


@app.command("fuzz")
def fuzz_command(
    trials: int = typer.Option(100, "--trials", help="Trials (trial i has seed SEED + i)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the first trial (--seed S --trials 1 replays trial S)."),
    max_world: int = typer.Option(8, "--max-world", help="Ranks at most in a drawn layout (2..8)."),
    model: str = typer.Option("gpt-moe", "--model", help="gpt-moe (the reference trainer) or pipelining-moe "
                              "(examples/pipelining-moe's script: 2-3 stages, docs/fuzz.md)."),
    exact_reference: bool = typer.Option(False, "--exact-reference", help="One failure-free reference per full "
                                         "configuration (default: one per shape: layout, model, steps)."),
    draws: int = typer.Option(None, "--draws", help="Draw version (gpt-moe: 2, the default, also draws "
                              "compute_dtype; 1 replays seeds found before it; 3 adds a preempt, transient nan or "
                              "slow fault; docs/fuzz.md)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the state dirs of passed trials too."),
    templates: bool = typer.Option(False, "--templates", help="Fork the faulted runs' processes from template "
                                   "processes, as lifeline run does (default: fresh processes; docs/fuzz.md)."),
    state_dir: str = _state_dir("Directory for the runs (default: a new temp dir; failed trials are kept)."),
) -> None:
    """Differential fuzzer: random configurations under random faults vs the failure-free run: same digest,
    same loss at every step, the cheapest rung, no second recovery without a second fault, time lost bounded."""
    import json

    _check((trials < 1, "--trials", f"must be >= 1, got {trials}"),
           (seed < 0, "--seed", f"must be >= 0, got {seed}"),
           (not 2 <= max_world <= 8, "--max-world", f"must be in [2, 8], got {max_world}"),
           (model not in ("gpt-moe", "pipelining-moe"), "--model", f"must be gpt-moe or pipelining-moe, got {model!r}"),
           (draws is not None and draws < 1, "--draws", f"must be >= 1, got {draws}"),
           state_dir=state_dir)
    from lifeline.bench.fuzz import drawer, run

    drawer(model, draws)  # an unknown draw version is refused before any run
    typer.echo(json.dumps(run(trials=trials, seed=seed, max_world=max_world, workdir=state_dir, keep=keep,
                              exact_reference=exact_reference, templates=templates, model=model, draws=draws),
                          indent=1))


def _changes(text: str) -> tuple[tuple[int, int], ...] | None:
    """``"4:2,2:4"`` -> ``((4, 2), (2, 4))``; ``None`` when malformed or a degree is < 1 or A == B."""
    try:
        out = tuple((int(a), int(b)) for a, b in (part.split(":") for part in text.split(",") if part.strip()))
    except ValueError:
        return None
    return out if out and all(1 <= a <= 8 and 1 <= b <= 8 and a != b for a, b in out) else None


@app.command("reshard")
def reshard_command(
    gib: float = typer.Option(1.0, "--gib", help="State size in GiB across the ranks (float32 tensors)."),
    repeats: int = typer.Option(3, "--repeats", help="Timed runs per peer and row (median reported)."),
    tensors: int = typer.Option(64, "--tensors", help="Number of tensors of the state (each rows x 1024)."),
    changes: str = typer.Option("4:2,2:4", "--changes", help="Tensor degrees A:B, one row each, comma-separated "
                                "(A ranks save, B ranks load; 1..8, A != B)."),
    profile: bool = typer.Option(False, "--profile", help="Also run each peer once under cProfile (rank 0's top "
                                 "entries in the JSON)."),
    state_dir: str = _state_dir("Directory for MinIO, Redis and logs (default: the temp dir; removed after)."),
) -> None:
    """Plan to training resumed in a new layout: reshard from sidecar memory (L1), from MinIO (L2), and DCP's
    load-time resharding from the same MinIO; bytes read / bytes needed."""
    import json

    parsed = _changes(changes)
    _check((not gib > 0, "--gib", f"must be > 0, got {gib:g}"),
           (repeats < 1, "--repeats", f"must be >= 1, got {repeats}"),
           (tensors < 1, "--tensors", f"must be >= 1, got {tensors}"),
           (parsed is None, "--changes", f"must be A:B pairs of tensor degrees 1..8 with A != B, e.g. 4:2,2:4, "
            f"got {changes!r}"), state_dir=state_dir)
    from lifeline.bench.reshard import run

    typer.echo(json.dumps(run(gib=gib, repeats=repeats, tensors=tensors, changes=parsed, workdir=state_dir,
                              profile=profile), indent=1))
