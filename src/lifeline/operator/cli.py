"""``python -m lifeline operator``: run the kopf operator with Lifeline's handlers."""

from __future__ import annotations

import logging

import typer

__all__ = ["operator_command"]


def operator_command(
    namespace: list[str] = typer.Option(
        None, "--namespace", "-n", help="Namespace to watch (repeatable). Default: LIFELINE_OPERATOR_NAMESPACES, "
        "else every namespace."
    ),
    redis_url: str = typer.Option(None, help="Catalog URL (default: LIFELINE_OPERATOR_REDIS_URL)."),
    liveness_port: int = typer.Option(None, help="kopf /healthz port (default: LIFELINE_OPERATOR_LIVENESS_PORT, 8081; -1: off)."),
    metrics_port: int = typer.Option(None, help="Prometheus /metrics port (default: LIFELINE_OPERATOR_METRICS_PORT, 8080; -1: off)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    """Run the TrainingJob operator (kopf). Credentials: in-cluster, else ``KUBECONFIG``.

    Settings come from ``LIFELINE_OPERATOR_*`` variables (see ``lifeline.operator.settings``);
    the options above override them. Runs until SIGINT/SIGTERM.
    """
    import kopf

    from lifeline.operator import handlers  # noqa: F401 - registers the handlers
    from lifeline.operator.settings import OperatorSettings

    overrides = {k: v for k, v in dict(namespaces=namespace or None, redis_url=redis_url,
                                       liveness_port=liveness_port, metrics_port=metrics_port).items() if v is not None}
    settings = OperatorSettings.load(**overrides)
    level = logging.DEBUG if verbose else getattr(logging, settings.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers.register_timer(settings.resync_seconds)
    liveness = f"http://{settings.bind_address}:{settings.liveness_port}/healthz" if settings.liveness_port >= 0 else None
    kopf.run(
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(lifeline_settings=settings),
    )
