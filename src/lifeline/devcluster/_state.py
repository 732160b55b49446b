"""A dev cluster's state file (``<state_dir>/state.json``) and the daemons recorded in it.

The state file holds the cluster's id, ports, node names, the pids of its daemons, MinIO
credentials, its ``/dev/shm`` root, per-node resources, its pod-IP block (``net``) and the
binaries it runs. :class:`ClusterState` reads and writes it and starts, waits for and tracks
the daemons; :class:`~lifeline.devcluster.cluster.DevCluster` and the control-plane start-up
both work through it (neither imports the other's module).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lifeline.devcluster import _proc
from lifeline.devcluster._identity import ProcessRef
from lifeline.errors import ClusterError

__all__ = ["STATE_FILE", "STATE_SUBDIRS", "CONTROL_PLANE", "Ports", "MinioAccess", "ClusterState", "is_running"]

STATE_FILE = "state.json"
STATE_SUBDIRS = ("etcd", "pki", "kubeconfigs", "nodes", "logs", "redis", "minio", "helm", "kube-cache",
                 "kcm-certs", "scheduler-certs")
"""Subdirectories of the state directory that ``up`` removes first (a stopped cluster's leftovers)."""
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "redis", "minio")
"""Control-plane daemons in start order (``down`` stops them in reverse)."""


@dataclass(frozen=True)
class Ports:
    """TCP ports on 127.0.0.1 the control plane listens on (ints)."""

    apiserver: int = 6443
    etcd: int = 2379
    etcd_peer: int = 2380
    controller_manager: int = 10257
    scheduler: int = 10259
    redis: int = 6379
    minio: int = 9000

    @classmethod
    def auto(cls) -> Ports:
        """Free ports picked by the kernel (for tests running beside other clusters)."""
        chosen: set[int] = set()
        while len(chosen) < len(fields(cls)):
            chosen.add(_proc.free_port())
        return cls(*sorted(chosen))

    def check_free(self) -> None:
        """Raise :class:`ClusterError` naming the first taken port, its component and the option to change it."""
        for f in fields(self):
            _proc.check_port_free(getattr(self, f.name), f.name.replace("_", "-"),
                                  option=f"--{f.name.replace('_', '-')}-port")


@dataclass(frozen=True)
class MinioAccess:
    """How to reach the cluster's MinIO: ``endpoint`` (``127.0.0.1:PORT``, plain HTTP) and root credentials."""

    endpoint: str
    access_key: str
    secret_key: str


class ClusterState:
    """The parsed state file of one dev cluster, and its daemons' processes.

    Args:
        state_dir: absolute path of the state directory.

    Attributes:
        state_dir: the state directory (``Path``).
        data: the parsed ``state.json`` (a dict; :meth:`save` writes it back).

    Raises:
        ClusterError: ``state_dir`` holds no state file.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        path = state_dir / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no dev cluster state in {state_dir}; fix: `lifeline devcluster up "
                               f"--state-dir {state_dir}`", key=str(path))
        self.data: dict[str, Any] = json.loads(path.read_text())

    @classmethod
    def create(cls, state_dir: Path, data: dict[str, Any]) -> ClusterState:
        """Write ``data`` as the state file of ``state_dir`` (which must exist) and return its handle."""
        (state_dir / STATE_FILE).write_text(json.dumps(data, indent=1))
        return cls(state_dir)

    def load(self) -> None:
        """Re-read the state file: another process (the CLI) may have changed pids since."""
        self.data = json.loads((self.state_dir / STATE_FILE).read_text())

    def save(self) -> None:
        """Write :attr:`data` back atomically (temp file, rename)."""
        tmp = self.state_dir / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.state_dir / STATE_FILE)

    # ------------------------------------------------------------------ derived values
    @property
    def ports(self) -> Ports:
        """The ports this cluster was started with."""
        return Ports(**self.data["ports"])

    @property
    def server(self) -> str:
        """The API server URL, ``https://127.0.0.1:PORT``."""
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def minio(self) -> MinioAccess:
        """MinIO endpoint (``127.0.0.1:PORT``) and root credentials."""
        return MinioAccess(f"127.0.0.1:{self.ports.minio}", self.data["minio"]["access_key"],
                           self.data["minio"]["secret_key"])

    @property
    def pids(self) -> dict[str, int]:
        """``{daemon name: pid}`` (the live dict inside :attr:`data`; call :meth:`save` after changing it)."""
        return self.data["pids"]

    # ------------------------------------------------------------------ daemons
    def log_file(self, name: str) -> Path:
        """The log file of daemon ``name`` (``<state_dir>/logs/<name>.log``)."""
        return self.state_dir / "logs" / f"{name}.log"

    def log_tail(self, name: str) -> str:
        """The last 3000 characters of daemon ``name``'s log."""
        return self.log_file(name).read_text(errors="replace")[-3000:]

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start daemon ``name`` (own session, output to :meth:`log_file`), record its pid and save; returns it."""
        p = _proc.spawn(argv, log=self.log_file(name), env=env, cwd=self.state_dir)
        self.record(name, p.pid)
        self.save()
        return p.pid

    def record(self, name: str, pid: int) -> None:
        """Record daemon ``name`` as process ``pid`` with its start time (call :meth:`save` after)."""
        self.pids[name] = pid
        self.data.setdefault("starts", {})[name] = ProcessRef.of(pid).start

    def process(self, name: str) -> ProcessRef | None:
        """Daemon ``name``'s recorded process (``None``: never started), checked by start time when
        its signals are sent: a recorded pid may name another process by now."""
        pid = self.data.get("pids", {}).get(name)
        return None if not pid else ProcessRef(pid, self.data.get("starts", {}).get(name))

    def wait_http(self, name: str, url: str, timeout: float, ctx: ssl.SSLContext | None = None) -> None:
        """Wait up to ``timeout`` seconds until ``url`` answers 200.

        Raises:
            ClusterError: daemon ``name`` exited (with its log's tail), or the deadline passed.
        """
        ref = self.process(name)

        def check() -> None:
            if ref is None or not ref.alive():
                raise ClusterError(f"{name} exited during startup; log {self.state_dir}/logs/{name}.log:\n"
                                   f"{self.log_tail(name)}")

        def ok() -> bool:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:  # noqa: S310 - loopback
                return r.status == 200

        _proc.wait_until(ok, timeout=timeout, what=f"{name} at {url}", check=check, interval=0.1)

    def running(self) -> list[str]:
        """Names of the recorded daemons that are alive now (as of the last :meth:`load`)."""
        return [n for n in self.data.get("pids", {}) if (ref := self.process(n)) is not None and ref.alive()]


def is_running(state_dir: Path) -> bool:
    """Whether a dev cluster with a process alive is recorded in ``state_dir`` (False when unreadable)."""
    try:
        return bool(ClusterState(Path(state_dir).resolve()).running())
    except (ClusterError, OSError, ValueError):
        return False
