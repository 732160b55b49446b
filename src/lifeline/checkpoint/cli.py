"""``lifeline ckpt ls | show | verify | export | import | rm | gc``: checkpoints at a path or an s3:// URI.

S3 options follow the one naming scheme of docs/cli.md: ``--s3-endpoint`` (``LIFELINE_S3_ENDPOINT``),
``--s3-access-key``/``--s3-secret-key`` (``LIFELINE_S3_ACCESS_KEY``/``LIFELINE_S3_SECRET_KEY``, falling
back to ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), TLS unless ``--s3-insecure``. A URI that does
not exist or holds no checkpoint, an unknown job or step, an output that exists (without ``--force``):
one :class:`~lifeline.errors.ConfigError` naming the URI or the flag, before anything is read or written.
The checkpoint code (torch) and rich are imported inside the commands so ``lifeline --help`` stays fast.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

import typer

from lifeline.checkpoint._resolve import SCHEMES, StorageOptions, storage_from_uri, uri_scheme
from lifeline.checkpoint._storage import Storage
from lifeline.errors import ConfigError

app = typer.Typer(no_args_is_help=True)

_URI = typer.Argument(..., metavar="URI", help="Checkpoint root: a path, file:///path or s3://bucket/prefix.")
_JOB = typer.Option(..., "--job", "-j", help="Job name.")
_STEP = typer.Option(None, "--step", "-s", help="Step (default: latest committed).")
_ENDPOINT = typer.Option(None, "--s3-endpoint", envvar="LIFELINE_S3_ENDPOINT", help="S3 host:port (s3:// URIs).")
_ACCESS = typer.Option(None, "--s3-access-key", envvar=["LIFELINE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID"],
                       help="S3 access key.", show_envvar=True)
_SECRET = typer.Option(None, "--s3-secret-key", envvar=["LIFELINE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"],
                       help="S3 secret key.", show_envvar=True)
_INSECURE = typer.Option(False, "--s3-insecure", envvar="LIFELINE_S3_INSECURE",
                         help="Plain HTTP to the S3 endpoint (default: TLS).")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_MANIFEST = re.compile(r"(?P<job>[^/]+)/(?P<step>\d{12})/manifest\.json")


def cli_options(endpoint: Optional[str], access: Optional[str], secret: Optional[str],
                insecure: bool) -> StorageOptions:
    """The :class:`StorageOptions` of the ``--s3-*`` flags (the environment fills what they leave out)."""
    return StorageOptions(endpoint=endpoint, access_key=access, secret_key=secret, secure=not insecure)


def cli_storage(uri: str, endpoint: Optional[str], access: Optional[str], secret: Optional[str], insecure: bool, *,
                create: bool = False) -> tuple[Storage, str]:
    """``(storage, prefix)`` of a checkpoint root given on the command line, opened through
    :func:`~lifeline.checkpoint.storage_from_uri`; the ``ckpt`` and ``densify`` commands use it.

    Raises:
        ConfigError: a URI or flag that cannot be used, naming it (an S3 bucket name, a missing
            ``--s3-*`` flag, a path that is not a directory; ``create``: its parent must be one).
    """
    scheme = uri_scheme(uri)
    if scheme == "s3":
        bucket = uri[5:].split("/", 1)[0]
        if not _BUCKET.fullmatch(bucket):
            raise ConfigError(f"{uri}: {bucket!r} is not an S3 bucket name (3-63 lower-case letters, digits, '.', "
                              "'-')", field="URI")
        missing = [f for f, v in (("--s3-endpoint", endpoint), ("--s3-access-key", access),
                                  ("--s3-secret-key", secret)) if not v]
        if missing:
            raise ConfigError(f"{uri} needs {', '.join(missing)} (or LIFELINE_S3_ENDPOINT, LIFELINE_S3_ACCESS_KEY, "
                              "LIFELINE_S3_SECRET_KEY)", field=missing[0])
    elif scheme == "file":
        path = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
        if not path.is_dir() and not (create and not path.exists() and path.parent.is_dir()):
            what = "is not a directory" if path.exists() else "does not exist"
            raise ConfigError(f"{uri} {what}: give the checkpoint root (a directory, file:///path or "
                              "s3://bucket/prefix)", field="URI")
    elif scheme not in SCHEMES or scheme == "memory":
        raise ConfigError(f"{uri}: use a path, file:///path or s3://bucket/prefix", field="URI")
    return storage_from_uri(uri, cli_options(endpoint, access, secret, insecure))


def _jobs(storage: Storage, prefix: str) -> dict[str, list[int]]:
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    jobs: dict[str, list[int]] = {}
    for key in storage.list(base):
        m = _MANIFEST.fullmatch(key[len(base):])
        if m:
            jobs.setdefault(m["job"], []).append(int(m["step"]))
    return {j: sorted(s) for j, s in sorted(jobs.items())}


def _steps(storage: Storage, prefix: str, uri: str, job: str) -> list[int]:
    from lifeline.checkpoint import list_steps

    steps = list_steps(storage, prefix, job)
    if not steps:
        known = ", ".join(_jobs(storage, prefix)) or "none"
        raise ConfigError(f"--job {job!r}: no committed checkpoint of it at {uri} (jobs there: {known})", field="--job")
    return steps


def _step(storage: Storage, prefix: str, uri: str, job: str, step: Optional[int]) -> int:
    steps = _steps(storage, prefix, uri, job)
    if step is None:
        return steps[-1]
    if step not in steps:
        shown = ", ".join(map(str, steps[-8:]))
        raise ConfigError(f"--step {step}: job {job!r} at {uri} has no committed step {step} (latest: {shown})",
                          field="--step")
    return step


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


@app.command("ls")
def ls_command(uri: str = _URI, job: Optional[str] = typer.Option(None, "--job", "-j", help="Only this job."),
               s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
               s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """List jobs and their committed steps (steps without a manifest do not exist)."""
    from rich.console import Console
    from rich.table import Table

    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    jobs = _jobs(storage, prefix)
    if not jobs:
        raise ConfigError(f"{uri} is not a checkpoint store: it holds no committed checkpoint "
                          "(<job>/<step>/manifest.json)", field="URI")
    if job is not None:
        jobs = {job: _steps(storage, prefix, uri, job)}
    table = Table(title=f"checkpoints at {uri}")
    for col, justify in (("job", "left"), ("steps", "right"), ("latest", "right"), ("committed steps", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name, steps in jobs.items():
        shown = ", ".join(map(str, steps[-8:])) + (" ..." if len(steps) > 8 else "")
        table.add_row(name, str(len(steps)), str(steps[-1]), shown)
    Console().print(table)


@app.command("show")
def show_command(uri: str = _URI, job: str = _JOB, step: Optional[int] = _STEP,
                 tensors: bool = typer.Option(True, "--tensors/--no-tensors", help="List every tensor."),
                 verify: bool = typer.Option(True, "--verify/--no-verify", help="Read every blob and check its "
                                             "checksums; exit 2 when one is missing or corrupt."),
                 s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
                 s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Show a checkpoint's manifest: layout, blobs, tensors (shape, dtype, pattern, chunks), byte entries."""
    from rich.console import Console
    from rich.table import Table

    from lifeline.checkpoint import read_manifest, verify_checkpoint

    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    step = _step(storage, prefix, uri, job, step)
    m = read_manifest(storage, prefix, job, step)
    console = Console()
    lay = m.layout
    console.print(f"[bold]{job}[/] step [bold]{m.step}[/]  format v{m.version}  layout tensor={lay.tensor} "
                  f"pipeline={lay.pipeline} data={lay.data} expert={lay.expert}  world size {lay.world_size}  "
                  f"{len(m.tensors)} tensors  {_human(m.nbytes)} in {len(m.blobs)} blobs")
    if tensors:
        table = Table()
        for col in ("tensor", "dtype", "shape", "pattern", "chunks", "copies"):
            table.add_column(col)
        for fqn, rec in sorted(m.tensors.items()):
            pattern = dict(rec.pattern)
            kind = pattern.pop("kind", "?")
            args = ", ".join(f"{k}={v}" for k, v in pattern.items() if v is not None)
            boxes = {(r.chunk.offsets, r.chunk.lengths) for r in rec.chunks}
            table.add_row(fqn, rec.dtype, str(list(rec.shape)), f"{kind}({args})", str(len(boxes)),
                          str(len(rec.chunks) // max(1, len(boxes))))
        console.print(table)
    keys = sorted({k for e in m.bytes_entries.values() for k in e})
    if keys:
        console.print(f"byte entries (per rank): {', '.join(keys)}")
    if verify:
        verify_checkpoint(storage, prefix, job, step)  # raises naming the missing blob or corrupt chunk
        console.print("[green]every blob present and verified[/]")


@app.command("verify")
def verify_command(uri: str = _URI, job: str = _JOB, step: Optional[int] = _STEP,
                   s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
                   s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Read every blob (in bounded windows) and check every chunk's crc32c; exits 2 naming the first bad chunk."""
    from rich.console import Console

    from lifeline.checkpoint import verify_checkpoint

    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    step = _step(storage, prefix, uri, job, step)
    t0 = time.perf_counter()
    m = verify_checkpoint(storage, prefix, job, step)
    chunks = sum(len(t.chunks) for t in m.tensors.values())
    Console().print(f"[green]ok[/] {job} step {step}: {len(m.blobs)} blobs, {chunks} chunks, "
                    f"{_human(m.nbytes)} verified in {time.perf_counter() - t0:.2f} s")


def _check_out(out: Path, to: str, force: bool) -> None:
    if to not in ("dcp", "safetensors"):
        raise ConfigError(f"--to {to!r}: use dcp or safetensors", field="--to")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: its directory {out.parent} does not exist; create it first", field="--out")
    if to == "safetensors" and out.is_dir():
        raise ConfigError(f"--out {out} is a directory: safetensors writes one file; give a file name", field="--out")
    if to == "dcp" and out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: dcp writes a directory", field="--out")
    if out.exists() and not force and (to == "safetensors" or any(out.iterdir())):
        what = "exists" if to == "safetensors" else "is a directory that is not empty"
        raise ConfigError(f"--out {out} {what}; pass --force to replace it", field="--out")


@app.command("export")
def export_command(uri: str = _URI, job: str = _JOB,
                   out: Path = typer.Option(..., "--out", "-o", help="Output directory (dcp) or file (safetensors)."),
                   to: str = typer.Option("dcp", "--to", help="dcp (torch.distributed.checkpoint) or safetensors."),
                   step: Optional[int] = _STEP,
                   force: bool = typer.Option(False, "--force", help="Replace an existing output."),
                   s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
                   s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Export a checkpoint, consolidated, to torch.distributed.checkpoint or safetensors (written under a
    temporary name, then renamed; a chunk read from another copy because one was corrupt is a warning)."""
    from rich.console import Console

    _check_out(out, to, force)
    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    step = _step(storage, prefix, uri, job, step)
    from lifeline.checkpoint.interop import export_dcp, export_safetensors

    fallbacks: list[str] = []
    export = export_dcp if to == "dcp" else export_safetensors
    names = export(storage, prefix, job, step, out, overwrite=force, fallbacks=fallbacks)
    err = Console(stderr=True)
    for line in fallbacks:
        err.print(f"warning: corrupt or unreadable copy skipped: {line}", markup=False, highlight=False)
    Console().print(f"[green]exported[/] {job} step {step} ({len(names)} entries) to {to} at {out}")


@app.command("import")
def import_command(source: Path = typer.Argument(..., metavar="SOURCE", help="A DCP directory or a .safetensors file."),
                   uri: str = _URI, job: str = _JOB,
                   step: int = typer.Option(..., "--step", "-s", help="Step number to store it as."),
                   s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
                   s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Import a DCP checkpoint or a safetensors file of full tensors as one step of JOB (one rank, every
    tensor whole and replicated): any layout loads it, the planner reading what each rank needs."""
    from rich.console import Console

    if not source.exists():
        raise ConfigError(f"SOURCE {source} does not exist", field="SOURCE")
    if step < 0:
        raise ConfigError(f"--step must be >= 0, got {step}", field="--step")
    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure, create=True)
    from lifeline.checkpoint import list_steps
    from lifeline.checkpoint.interop import import_dcp, import_safetensors

    if step in list_steps(storage, prefix, job):
        raise ConfigError(f"--step {step}: job {job!r} at {uri} already has step {step}; remove it first "
                          "(lifeline ckpt rm) or choose another step", field="--step")
    if source.is_dir():
        m = import_dcp(source, storage, prefix, job, step)
    else:
        m = import_safetensors(source, storage, prefix, job, step)
    Console().print(f"[green]imported[/] {source} as {job} step {step} ({len(m.tensors)} tensors) at {uri}")


@app.command("rm")
def rm_command(uri: str = _URI, job: str = _JOB, step: int = typer.Option(..., "--step", "-s", help="Step to remove."),
               s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
               s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Remove one checkpoint: its manifest first (the step stops existing), then its blobs."""
    from lifeline.checkpoint import delete_step

    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    step = _step(storage, prefix, uri, job, step)
    delete_step(storage, prefix, job, step)
    typer.echo(f"removed {job} step {step} at {uri}")


@app.command("gc")
def gc_command(uri: str = _URI, job: str = _JOB,
               keep: int = typer.Option(..., "--keep", help="Newest committed steps to keep (>= 1)."),
               dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be removed."),
               s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
               s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE) -> None:
    """Remove every committed step of JOB but the newest KEEP."""
    from lifeline.checkpoint import delete_step

    if keep < 1:
        raise ConfigError(f"--keep must be >= 1 (ckpt rm removes single steps), got {keep}", field="--keep")
    storage, prefix = cli_storage(uri, s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    steps = _steps(storage, prefix, uri, job)
    doomed = steps[:-keep]
    for s in doomed:
        if not dry_run:
            delete_step(storage, prefix, job, s)
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {len(doomed)} step(s) of {job} at {uri}" + (f": {', '.join(map(str, doomed))}" if doomed
                                                                     else "") + f"; kept {', '.join(map(str, steps[-keep:]))}")



