"""Where a dev-cluster pod's files lie on its node: container pid files and per-run log files.

A node's pod worker keeps, under ``<node dir>/pods/<pod uid>/``, ``containers/<name>.pid`` (the
process-group id of a running container) and ``logs/<name>/<run>.log`` (one file per run, ``run``
counting from 0).
"""

from __future__ import annotations

from pathlib import Path

from lifeline.errors import ClusterError, ConfigError

__all__ = ["container_pid_file", "container_log"]


def container_pid_file(pod_dir: Path, container: str | None, *, pod: str, namespace: str) -> Path:
    """The pid file of ``container`` (``None``: the pod's only running container) in ``pod_dir``.

    Raises:
        ConfigError: ``container`` is None and the pod runs more or fewer than one container, or
            ``container`` is not running.
    """
    names = sorted(p.stem for p in (pod_dir / "containers").glob("*.pid"))
    if container is None:
        if len(names) != 1:
            raise ConfigError(f"pod {namespace}/{pod} has containers {names}; pass -c NAME",
                              field="container")
        container = names[0]
    pidf = pod_dir / "containers" / f"{container}.pid"
    if not pidf.exists():
        raise ConfigError(f"pod {namespace}/{pod} has no running container {container!r}; "
                          f"running: {names}", field="container")
    return pidf


def container_log(pod_dir: Path, container: str | None, *, pod: str, namespace: str, previous: bool) -> Path:
    """The log file of ``container``'s current run (``previous``: the run before it) in ``pod_dir``.

    Raises:
        ConfigError: ``container`` is None and the pod has logs of more or fewer than one container.
        ClusterError: no such run has a log yet.
    """
    d = pod_dir / "logs"
    names = sorted(p.name for p in d.iterdir()) if d.exists() else []
    if container is None:
        if len(names) != 1:
            raise ConfigError(f"pod {namespace}/{pod} has containers {names}; pass -c NAME",
                              field="container")
        container = names[0]
    runs = sorted((d / container).glob("*.log"), key=lambda p: int(p.stem)) if (d / container).exists() else []
    if not runs or (previous and len(runs) < 2):
        raise ClusterError(f"no {'previous ' if previous else ''}log for container {container!r} of pod "
                           f"{namespace}/{pod}; containers with logs: {names}", key=pod)
    return runs[-2] if previous else runs[-1]
