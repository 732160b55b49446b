"""``python -m lifeline sidecar``: run the checkpoint sidecar from ``LIFELINE_*`` settings."""

from __future__ import annotations

import typer


def sidecar_command(
    log_level: str = typer.Option("INFO", "--log-level", envvar="LIFELINE_LOG_LEVEL", help="Python log level."),
) -> None:
    """Run the checkpoint sidecar (software DPU) of this pod until SIGTERM.

    Every setting comes from ``LIFELINE_*`` environment variables (see
    ``lifeline.api.pod.SidecarSettings``); a bad one exits with a message naming it.
    """
    from lifeline.api.pod import SidecarSettings
    from lifeline.sidecar._logging import setup_logging
    from lifeline.sidecar.server import run_sidecar

    settings = SidecarSettings.load()
    setup_logging(log_level, job=settings.job, rank=settings.rank)
    run_sidecar(settings)
