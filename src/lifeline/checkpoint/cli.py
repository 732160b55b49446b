"""``lifeline ckpt ls | show | verify | export``: inspect checkpoints at a path or an s3:// URI.

The checkpoint code (torch) and rich are imported inside the commands, so that ``lifeline --help``
(which imports this module) stays fast; the storage protocol module imports nothing heavy.
"""

from __future__ import annotations

import re
import time
from typing import Optional

import typer

from lifeline.checkpoint._storage import Storage
from lifeline.errors import ConfigError, ManifestError

app = typer.Typer(no_args_is_help=True)

_ENDPOINT = typer.Option(None, "--endpoint", envvar="LIFELINE_S3_ENDPOINT", help="S3 host:port (s3:// URIs).")
_ACCESS = typer.Option(None, "--access-key", envvar="AWS_ACCESS_KEY_ID", help="S3 access key.")
_SECRET = typer.Option(None, "--secret-key", envvar="AWS_SECRET_ACCESS_KEY", help="S3 secret key.")
_SECURE = typer.Option(False, "--secure/--insecure", help="TLS for S3.")


def _storage(uri: str, endpoint: Optional[str], access: Optional[str], secret: Optional[str],
             secure: bool) -> tuple[Storage, str]:
    from lifeline.checkpoint import storage_from_uri

    if uri.startswith("s3://"):
        return storage_from_uri(uri, endpoint=endpoint, access_key=access, secret_key=secret, secure=secure)
    return storage_from_uri(uri, fsync=False)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def _jobs(storage: Storage, prefix: str) -> dict[str, list[int]]:
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    rx = re.compile(r"(?P<job>[^/]+)/(?P<step>\d{12})/manifest\.json")
    jobs: dict[str, list[int]] = {}
    for key in storage.list(base):
        m = rx.fullmatch(key[len(base):])
        if m:
            jobs.setdefault(m["job"], []).append(int(m["step"]))
    return {j: sorted(s) for j, s in sorted(jobs.items())}


def _step(storage: Storage, prefix: str, job: str, step: Optional[int]) -> int:
    from lifeline.checkpoint import list_steps

    if step is not None:
        return step
    steps = list_steps(storage, prefix, job)
    if not steps:
        raise ManifestError(f"job {job!r} has no committed checkpoint under this URI; check --job", job=job)
    return steps[-1]


@app.command("ls")
def ls_command(
    uri: str = typer.Argument(..., help="Checkpoint root: a path, file:///path or s3://bucket/prefix."),
    job: Optional[str] = typer.Option(None, "--job", "-j", help="Only this job."),
    endpoint: Optional[str] = _ENDPOINT, access_key: Optional[str] = _ACCESS, secret_key: Optional[str] = _SECRET,
    secure: bool = _SECURE,
) -> None:
    """List jobs and their committed steps (steps without a manifest do not exist)."""
    from rich.console import Console
    from rich.table import Table

    storage, prefix = _storage(uri, endpoint, access_key, secret_key, secure)
    jobs = _jobs(storage, prefix)
    if job is not None:
        jobs = {job: jobs.get(job, [])}
    table = Table(title=f"checkpoints at {uri}")
    table.add_column("job")
    table.add_column("steps", justify="right")
    table.add_column("latest", justify="right")
    table.add_column("committed steps")
    for name, steps in jobs.items():
        shown = ", ".join(map(str, steps[-8:])) + (" ..." if len(steps) > 8 else "")
        table.add_row(name, str(len(steps)), str(steps[-1]) if steps else "-", shown)
    Console().print(table)


@app.command("show")
def show_command(
    uri: str = typer.Argument(..., help="Checkpoint root: a path, file:///path or s3://bucket/prefix."),
    job: str = typer.Option(..., "--job", "-j", help="Job name."),
    step: Optional[int] = typer.Option(None, "--step", "-s", help="Step (default: latest committed)."),
    tensors: bool = typer.Option(True, "--tensors/--no-tensors", help="List every tensor."),
    endpoint: Optional[str] = _ENDPOINT, access_key: Optional[str] = _ACCESS, secret_key: Optional[str] = _SECRET,
    secure: bool = _SECURE,
) -> None:
    """Show a checkpoint's manifest: layout, blobs, tensors (shape, dtype, pattern, chunks), byte entries."""
    from rich.console import Console
    from rich.table import Table

    from lifeline.checkpoint import read_manifest

    storage, prefix = _storage(uri, endpoint, access_key, secret_key, secure)
    step = _step(storage, prefix, job, step)
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


@app.command("verify")
def verify_command(
    uri: str = typer.Argument(..., help="Checkpoint root: a path, file:///path or s3://bucket/prefix."),
    job: str = typer.Option(..., "--job", "-j", help="Job name."),
    step: Optional[int] = typer.Option(None, "--step", "-s", help="Step (default: latest committed)."),
    endpoint: Optional[str] = _ENDPOINT, access_key: Optional[str] = _ACCESS, secret_key: Optional[str] = _SECRET,
    secure: bool = _SECURE,
) -> None:
    """Read every blob (in bounded windows) and check every chunk's crc32c; exits 2 naming the first bad chunk."""
    from rich.console import Console

    from lifeline.checkpoint import verify_checkpoint

    storage, prefix = _storage(uri, endpoint, access_key, secret_key, secure)
    step = _step(storage, prefix, job, step)
    t0 = time.perf_counter()
    m = verify_checkpoint(storage, prefix, job, step)
    dt = time.perf_counter() - t0
    chunks = sum(len(t.chunks) for t in m.tensors.values())
    Console().print(f"[green]ok[/] {job} step {step}: {len(m.blobs)} blobs, {chunks} chunks, "
                    f"{_human(m.nbytes)} verified in {dt:.2f} s")


@app.command("export")
def export_command(
    uri: str = typer.Argument(..., help="Checkpoint root: a path, file:///path or s3://bucket/prefix."),
    job: str = typer.Option(..., "--job", "-j", help="Job name."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (dcp) or file (safetensors)."),
    to: str = typer.Option("dcp", "--to", help="dcp (torch.distributed.checkpoint) or safetensors."),
    step: Optional[int] = typer.Option(None, "--step", "-s", help="Step (default: latest committed)."),
    endpoint: Optional[str] = _ENDPOINT, access_key: Optional[str] = _ACCESS, secret_key: Optional[str] = _SECRET,
    secure: bool = _SECURE,
) -> None:
    """Export a checkpoint, consolidated, to torch.distributed.checkpoint or safetensors."""
    from rich.console import Console

    from lifeline.checkpoint.interop import export_dcp, export_safetensors

    storage, prefix = _storage(uri, endpoint, access_key, secret_key, secure)
    step = _step(storage, prefix, job, step)
    if to == "dcp":
        names = export_dcp(storage, prefix, job, step, out)
    elif to == "safetensors":
        names = export_safetensors(storage, prefix, job, step, out)
    else:
        raise ConfigError(f"--to {to!r}: use dcp or safetensors", field="to")
    Console().print(f"[green]exported[/] {job} step {step} ({len(names)} entries) to {to} at {out}")
