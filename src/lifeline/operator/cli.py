"""``python -m lifeline operator``: run the kopf operator with Lifeline's handlers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer

from lifeline.errors import ConfigError

__all__ = ["operator_command", "check_credentials"]


def check_credentials() -> None:
    """Fail fast when the operator has no way to reach a cluster: not in a pod (no
    ``KUBERNETES_SERVICE_HOST``) and no kubeconfig file (``KUBECONFIG``'s files, else ~/.kube/config).

    Raises:
        ConfigError: naming ``KUBECONFIG`` and the files looked for.
    """
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return
    env = os.environ.get("KUBECONFIG", "")
    files = [Path(p) for p in env.split(os.pathsep) if p] or [Path.home() / ".kube" / "config"]
    if not any(f.is_file() for f in files):
        raise ConfigError(f"no kubeconfig: KUBECONFIG={env or '(unset)'}, looked for {', '.join(map(str, files))}; "
                          "set KUBECONFIG to a cluster's kubeconfig or run the operator in a pod", field="KUBECONFIG")


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
    check_credentials()
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
