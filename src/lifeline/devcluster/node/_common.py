"""What the node agent and its pod workers share: API time stamps, raw JSON calls, error lines, and
:class:`NodeHost`, the part of the agent a pod worker uses (so that ``pod`` does not import ``agent``)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Callable, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lifeline.errors import ClusterError

__all__ = ["NodeHost", "now_rfc3339", "raw", "describe"]


def now_rfc3339() -> str:
    """Current UTC time as an RFC 3339 string with seconds precision (Kubernetes ``Time``)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def raw(fn: Callable[..., Any], *args: Any, **kw: Any) -> dict:
    """Call a kubernetes client method and return the JSON body as a dict (camelCase keys).

    Raises whatever ``fn`` raises (:class:`~kubernetes.client.exceptions.ApiException` on an API refusal).
    """
    resp = fn(*args, _preload_content=False, **kw)
    return json.loads(resp.data)


def describe(err: Exception) -> str:
    """One line for an error: an API refusal's status and message, else the exception text."""
    if isinstance(err, ApiException):
        try:
            return f"API {err.status}: {json.loads(err.body)['message']}"
        except (TypeError, ValueError, KeyError):
            return f"API {err.status} {err.reason}"
    return str(err) if isinstance(err, ClusterError) else f"{type(err).__name__}: {err}"


class NodeHost(Protocol):
    """The node agent as its pod workers see it (:class:`~lifeline.devcluster.node.agent.NodeAgent`).

    Attributes:
        state_dir: the node's directory (``pods/<uid>/`` per pod).
        shm_dir: the node's ``/dev/shm`` directory (Memory-medium emptyDirs).
        server: API server URL (``https://127.0.0.1:PORT``), written into pods' kubeconfigs.
        ca: the cluster CA certificate's path.
        host_ip: the node's InternalIP.
        allocatable: ``{"cpu", "memory", "pods", "ephemeral-storage": quantity}``.
        core: the node's ``CoreV1Api`` (its ``system:node:<name>`` credentials).
    """

    state_dir: Path
    shm_dir: Path
    server: str
    ca: Path
    host_ip: str
    allocatable: dict[str, str]
    core: client.CoreV1Api

    def log(self, line: str) -> None:
        """Write a line to the agent's log."""

    def allocate_ip(self) -> str:
        """A free pod IP of this node."""
