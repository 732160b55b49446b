"""``python -m lifeline trainer`` (the reference GPT-MoE trainer under the runtime, configured from the
environment) and ``lifeline ckpt densify`` (a sparse window to a dense checkpoint, :mod:`lifeline.models.densify`).

``lifeline --help`` imports this module, so torch (the runtime, the model) is imported only when
the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from lifeline.checkpoint import StorageOptions
from lifeline.checkpoint.cli import _ACCESS, _ENDPOINT, _INSECURE, _SECRET
from lifeline.errors import ConfigError

__all__ = ["trainer_command", "densify_command"]


def trainer_command() -> None:
    """Run the reference GPT-MoE trainer under the Lifeline runtime (settings from ``LIFELINE_*``)."""
    from lifeline.models.gpt_moe._main import main

    main()


def densify_command(
    uri: str = typer.Argument(..., metavar="URI", help="Checkpoint root holding the job's sparse windows: a path, "
                              "file:///path or s3://bucket/prefix."),
    spec_file: Path = typer.Option(..., "--spec", help="The TrainingJob YAML the windows were taken under (layout, "
                                   "model arguments, seed)."),
    job: Optional[str] = typer.Option(None, "--job", "-j", help="Job name (default: the spec's metadata.name)."),
    window: Optional[int] = typer.Option(None, "--window", "-w", help="Start step of the window (default: the "
                                         "latest every rank committed)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Checkpoint root to write the dense checkpoint to "
                                      "(default: URI)."),
    s3_endpoint: Optional[str] = _ENDPOINT, s3_access_key: Optional[str] = _ACCESS,
    s3_secret_key: Optional[str] = _SECRET, s3_insecure: bool = _INSECURE,
) -> None:
    """Convert a sparse window (checkpoint.sparse) into a dense checkpoint of its last step: the job's ranks
    run locally (CPU, gloo), re-run the window's steps applying its slots, and save the state; prints one
    JSON object. The step must not exist at the output yet."""
    import json

    from lifeline.api import load_trainingjob
    from lifeline.models.densify import densify

    if not spec_file.is_file():
        raise ConfigError(f"--spec {spec_file} is not a file", field="--spec")
    tj = load_trainingjob(spec_file)
    if tj.spec.checkpoint.sparse is None:
        raise ConfigError(f"--spec {spec_file}: spec.checkpoint.sparse is not set; this job took no sparse windows",
                          field="spec.checkpoint.sparse")
    s3 = (s3_endpoint, s3_access_key, s3_secret_key, s3_insecure)
    source = _storage_args(uri, *s3)
    target = _storage_args(out or uri, *s3, create=True)
    result = densify(tj.spec, job or tj.metadata["name"], source, target, start=window)
    typer.echo(json.dumps(result, sort_keys=True))


def _storage_args(uri: str, endpoint: Optional[str], access: Optional[str], secret: Optional[str], insecure: bool,
                  *, create: bool = False) -> tuple[str, StorageOptions]:
    """``(uri, options)`` for a checkpoint root (what :func:`~lifeline.checkpoint.storage_from_uri` takes), checked
    like every ``ckpt`` URI."""
    from lifeline.checkpoint.cli import cli_options, cli_storage

    cli_storage(uri, endpoint, access, secret, insecure, create=create)  # a ConfigError naming the URI or flag
    return uri, cli_options(endpoint, access, secret, insecure)