"""The dev cluster: a real Kubernetes control plane built from source, plus process nodes.

:meth:`DevCluster.up` starts, each as a daemon in its own session under one state
directory: etcd, kube-apiserver (TLS, Node+RBAC authorization, NodeRestriction,
service-account token signing, 10 s not-ready/unreachable tolerations),
kube-controller-manager (all default controllers, per-controller service-account
credentials, 10 s node-monitor grace period), kube-scheduler, Redis, MinIO and N node
agents (``lifeline node run``). :meth:`DevCluster.down` stops all of them and leaves no
process and no file outside the state directory. See ``docs/devcluster.md``.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from lifeline.devcluster import _proc, build
from lifeline.devcluster._control_plane import start_control_plane
from lifeline.devcluster._identity import ProcessRef
from lifeline.devcluster._netclaim import claim_net, release_net, sweep_stale_arenas
from lifeline.devcluster._nodes import issue_node_credentials, node_agent_argv, pod_process_groups
from lifeline.devcluster._pod_files import container_log, container_pid_file
from lifeline.devcluster._state import (CONTROL_PLANE, STATE_FILE, STATE_SUBDIRS, ClusterState, MinioAccess, Ports,
                                        is_running)
from lifeline.devcluster._tools import run_tool, tool_env
from lifeline.errors import ClusterError, ConfigError

__all__ = ["Ports", "DevCluster", "MinioAccess", "STATE_FILE"]


class DevCluster:
    """Handle on a dev cluster's state directory (running or not).

    Args:
        state_dir: the state directory (made absolute).

    Attributes:
        state_dir: absolute path of the state directory.
        kubeconfig: the admin kubeconfig (``system:masters``).
        nodes: node names (``node-1`` ... ``node-N``).
        redis_url: ``redis://127.0.0.1:PORT/0``.
        minio_endpoint, minio_access_key, minio_secret_key: MinIO (plain HTTP).

    Raises:
        ClusterError: ``state_dir`` holds no dev cluster state.
    """

    def __init__(self, state_dir: str | Path) -> None:
        self._store = ClusterState(Path(state_dir).resolve())
        self.state_dir = self._store.state_dir

    # ------------------------------------------------------------------ properties
    @property
    def _state(self) -> dict[str, Any]:
        """The parsed state file (pids, net, id, ...), as last loaded."""
        return self._store.data

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig path."""
        return self.state_dir / "kubeconfig"

    @property
    def ports(self) -> Ports:
        """The ports this cluster was started with."""
        return self._store.ports

    @property
    def nodes(self) -> list[str]:
        """Node names."""
        return list(self._state["nodes"])

    @property
    def helm_binary(self) -> Path:
        """The helm built from source for this cluster (``lifeline devcluster build``)."""
        return Path(self._state["bins"]["helm"])

    @property
    def server(self) -> str:
        """The API server URL, ``https://127.0.0.1:PORT``."""
        return self._store.server

    @property
    def redis_url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.ports.redis}/0"

    @property
    def minio_endpoint(self) -> str:
        """``127.0.0.1:PORT`` (plain HTTP)."""
        return self._store.minio.endpoint

    @property
    def minio_access_key(self) -> str:
        """MinIO root user."""
        return self._store.minio.access_key

    @property
    def minio_secret_key(self) -> str:
        """MinIO root password."""
        return self._store.minio.secret_key

    @property
    def minio(self) -> MinioAccess:
        """MinIO endpoint and credentials (the same attribute names as :class:`MinioServer`)."""
        return self._store.minio

    @property
    def shm_root(self) -> Path:
        """``/dev/shm`` directory of Memory-medium emptyDir volumes (removed by :meth:`down`)."""
        return Path(self._state["shm_root"])

    def node_dir(self, node: str) -> Path:
        """State directory of ``node`` (pods, logs, pid files). Raises ClusterError for an unknown node."""
        self._check_node(node)
        return self.state_dir / "nodes" / node

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, state_dir: str | Path = ".state/devcluster", *, nodes: int = 3,
           ports: Ports | str | None = None, node_cpu: str = "4", node_memory: str = "8Gi",
           log: Callable[[str], None] | None = None, timeout: float = 120.0) -> DevCluster:
        """Start a dev cluster and return its handle once every node is Ready.

        Args:
            state_dir: where everything lives (created; must not hold a running cluster).
            nodes: number of process nodes (1..32).
            ports: :class:`Ports`, ``"auto"`` for free ports, or ``None`` for the defaults.
            node_cpu, node_memory: allocatable per node (Kubernetes quantities).
            log: progress callable (default: print to stderr).
            timeout: seconds to wait for each component to become ready.

        Raises:
            ConfigError: bad ``nodes``.
            ClusterError: a port is taken, the cluster is already up, or a component failed.
            BuildError: building a binary failed.
        """
        log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        if not 1 <= int(nodes) <= 32:
            raise ConfigError(f"nodes must be between 1 and 32, got {nodes}", field="nodes")
        state_dir = Path(state_dir).resolve()
        if (state_dir / STATE_FILE).exists():
            old = cls(state_dir)
            if old.running_components():
                raise ClusterError(f"a dev cluster is already running in {state_dir}; fix: "
                                   f"`lifeline devcluster down --state-dir {state_dir}` first")
        ports = Ports.auto() if ports == "auto" else (ports or Ports())
        ports.check_free()
        t0 = time.monotonic()
        bins = {b: build.binary(b) for b in ("etcd", "kube-apiserver", "kube-controller-manager",
                                             "kube-scheduler", "minio", "helm")}
        cid = secrets.token_hex(4)
        state = {
            "id": cid,
            "ports": asdict(ports),
            "nodes": [f"node-{i}" for i in range(1, nodes + 1)],
            "pids": {},
            "minio": {"access_key": "lifeline", "secret_key": secrets.token_hex(12)},
            "shm_root": f"/dev/shm/lifeline-{cid}",
            "node_resources": {"cpu": node_cpu, "memory": node_memory},
            "bins": {k: str(v) for k, v in bins.items()},
        }
        state_dir.mkdir(parents=True, exist_ok=True)
        state["net"] = claim_net(state_dir, is_running)
        sweep_stale_arenas(is_running)  # killed clusters' arenas: memory nothing else frees
        Path(state["shm_root"]).mkdir(parents=True, exist_ok=True)
        (Path(state["shm_root"]) / "owner").write_text(str(state_dir))
        for sub in STATE_SUBDIRS:  # a stopped cluster's leftovers: `up` always starts fresh
            shutil.rmtree(state_dir / sub, ignore_errors=True)
        ClusterState.create(state_dir, state)
        self = cls(state_dir)
        try:
            start_control_plane(self._store, bins, log, timeout)
            for i, name in enumerate(self.nodes, start=1):
                issue_node_credentials(self.state_dir, name, self.server)
                self.start_node(name, index=i)
            self.wait_nodes_ready(timeout=timeout)
            _proc.wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                                  "--ignore-not-found", "-o", "name").strip(),
                             timeout=timeout, what="ServiceAccount default/default", interval=0.2)
        except BaseException:
            self.down(log=lambda _l: None)
            raise
        log(f"[up] dev cluster ready in {time.monotonic() - t0:.1f}s; use it with:\n"
            f"  export KUBECONFIG={self.kubeconfig}\n  kubectl get nodes")
        return self

    def start_node(self, name: str, *, index: int | None = None) -> int:
        """(Re)start the agent of node ``name``; returns its pid. Raises ClusterError if it is running."""
        self._store.load()
        self._check_node(name)
        ref = self._store.process(name)
        if ref is not None and ref.alive():
            raise ClusterError(f"node {name} is already running (pid {ref.pid})", key=name)
        index = index or self.nodes.index(name) + 1
        return self._store.spawn(name, node_agent_argv(
            self.state_dir, name, index=index, node_dir=self.node_dir(name), shm_dir=self.shm_root / name,
            net=self._state["net"], resources=self._state["node_resources"], server=self.server))

    def down(self, *, log: Callable[[str], None] | None = None) -> None:
        """Stop every process of the cluster (nodes and their pods first) and remove its /dev/shm files.

        Leaves the state directory (logs, etcd data) in place; nothing outside it remains.
        """
        log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._store.load()
        for name in self.nodes:
            if (ref := self._store.process(name)) is not None:
                _proc.stop_group(ref, grace=10)
            for group in self._pod_process_groups(name):
                _proc.stop_group(group, grace=2)
        for name in reversed(CONTROL_PLANE):
            if (ref := self._store.process(name)) is not None:
                _proc.stop_group(ref, grace=10)
        shutil.rmtree(self.shm_root, ignore_errors=True)
        if "net" in self._state:
            release_net(self._state["net"], self.state_dir)
        self._state["pids"] = {}
        self._state["starts"] = {}
        self._store.save()
        log(f"[down] dev cluster in {self.state_dir} stopped")

    def _pod_process_groups(self, node: str) -> list[ProcessRef]:
        return pod_process_groups(self.state_dir / "nodes" / node)

    def _check_node(self, node: str) -> None:
        if node not in self._state["nodes"]:
            raise ClusterError(f"unknown node {node!r}; this cluster's nodes are "
                               f"{', '.join(self._state['nodes'])}", key=node)

    # ------------------------------------------------------------------ faults
    def kill_node(self, node: str) -> None:
        """SIGKILL node ``node``'s agent and every process of its pods: its Lease stops being renewed.

        Raises ClusterError for an unknown node."""
        self._check_node(node)
        self._store.load()
        if (ref := self._store.process(node)) is not None:
            _proc.kill_group(ref, signal.SIGKILL)
        for group in self._pod_process_groups(node):
            _proc.kill_group(group, signal.SIGKILL)

    def freeze_node(self, node: str, *, thaw: bool = False) -> None:
        """Stop (SIGSTOP) node ``node``'s agent so its heartbeats stop while pod processes keep running;
        ``thaw=True`` resumes it (SIGCONT). Raises ClusterError for an unknown or stopped node."""
        self._check_node(node)
        self._store.load()
        ref = self._store.process(node)
        if ref is None or not ref.signal(signal.SIGCONT if thaw else signal.SIGSTOP):
            raise ClusterError(f"node {node} is not running; fix: `lifeline devcluster start-node {node}`",
                               key=node)

    def kill_service(self, name: str) -> None:
        """SIGKILL the ``redis`` or ``minio`` server (its data dir stays). Raises ClusterError for another name."""
        self._store.load()
        ref = self._store.process(self._service(name))
        if ref is not None:
            _proc.kill_group(ref, signal.SIGKILL)
            _proc.wait_until(lambda: not ref.alive(), timeout=10, what=f"{name} to die", interval=0.02)

    def start_service(self, name: str) -> int:
        """Start a killed ``redis`` (empty) or ``minio`` (same data) on its port; returns the pid (ClusterError if not)."""
        from lifeline.devcluster.services import MinioServer, RedisServer

        self._store.load()
        ref = self._store.process(self._service(name))
        if ref is not None and ref.alive():
            raise ClusterError(f"{name} is already running (pid {ref.pid})", key=name)
        server = RedisServer(state_dir=self.state_dir / "redis", port=self.ports.redis) if name == "redis" else \
            MinioServer(state_dir=self.state_dir / "minio", port=self.ports.minio,
                        access_key=self.minio_access_key, secret_key=self.minio_secret_key)
        pid = server.start().detach()
        self._store.load()
        self._store.record(name, pid)
        self._store.save()
        return pid

    @staticmethod
    def _service(name: str) -> str:
        if name not in ("redis", "minio"):
            raise ClusterError(f"unknown service {name!r}; the dev cluster runs redis and minio", key=name)
        return name

    def kill_container(self, pod: str, container: str | None = None, *, namespace: str = "default") -> None:
        """SIGKILL one container's process group (the node restarts it per the pod's restartPolicy).

        Raises:
            ConfigError: ``container`` is not running (or None while the pod runs several).
            ClusterError: the pod does not exist or is not scheduled yet.
        """
        pidf = container_pid_file(self._pod_dir(pod, namespace), container, pod=pod, namespace=namespace)
        _proc.kill_group(ProcessRef.parse(pidf.read_text()), signal.SIGKILL)

    def _pod_dir(self, pod: str, namespace: str) -> Path:
        obj = json.loads(self.kubectl("get", "pod", pod, "-n", namespace, "-o", "json"))
        node, uid = obj["spec"].get("nodeName"), obj["metadata"]["uid"]
        if not node:
            raise ClusterError(f"pod {namespace}/{pod} is not scheduled yet", key=pod)
        return self.node_dir(node) / "pods" / uid

    def log_path(self, pod: str, container: str | None = None, *, namespace: str = "default",
                 previous: bool = False) -> Path:
        """The log file of a container's current (or previous) run.

        Raises:
            ConfigError: ``container`` is None while the pod has several containers.
            ClusterError: the pod is not found or not scheduled, or the run has no log.
        """
        return container_log(self._pod_dir(pod, namespace), container, pod=pod, namespace=namespace,
                             previous=previous)

    # ------------------------------------------------------------------ tools
    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60) -> str:
        """Run ``kubectl`` against this cluster; returns stdout. Raises ClusterError on failure when ``check``."""
        cmd = ["kubectl", f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.state_dir / 'kube-cache'}",
               *args]
        return run_tool(cmd, env=tool_env(self.state_dir, self.kubeconfig), check=check, input=input,
                        timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """Run the cluster's ``helm`` (built from source) against it; returns stdout.

        Raises ClusterError on failure when ``check``."""
        return run_tool([str(self.helm_binary), *args], env=tool_env(self.state_dir, self.kubeconfig), check=check,
                        input=None, timeout=timeout)

    def api_client(self):
        """A :class:`kubernetes.client.ApiClient` with admin credentials."""
        # kept here: this module is imported by `lifeline --help`, which must not load the kubernetes client
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    def create_namespace(self, name: str, *, timeout: float = 30) -> None:
        """Create namespace ``name`` and wait until its ``default`` ServiceAccount exists (ClusterError otherwise)."""
        self.kubectl("create", "namespace", name)
        _proc.wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", name,
                                              "--ignore-not-found", "-o", "name").strip(),
                         timeout=timeout, what=f"ServiceAccount {name}/default", interval=0.2)

    def wait_nodes_ready(self, *, timeout: float = 60, nodes: list[str] | None = None) -> None:
        """Wait until every node in ``nodes`` (default: all) reports Ready=True.

        Raises ClusterError when ``timeout`` seconds pass or a node's agent exits."""
        want = set(nodes or self.nodes)

        def ready() -> bool:
            items = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            ok = {n["metadata"]["name"] for n in items
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
            return want <= ok

        def check() -> None:
            for n in want:
                ref = self._store.process(n)
                if ref is not None and not ref.alive():
                    raise ClusterError(f"node agent {n} exited; log {self.state_dir}/logs/{n}.log:\n"
                                       f"{self._store.log_tail(n)}", key=n)

        _proc.wait_until(ready, timeout=timeout, what=f"nodes {sorted(want)} Ready", interval=0.25, check=check)

    # ------------------------------------------------------------------ status
    def running_components(self) -> list[str]:
        """Names of the cluster's processes that are alive now."""
        self._store.load()
        return self._store.running()

    def status(self) -> dict[str, Any]:
        """``{"components": {name: {"pid", "state"}}, "nodes": {name: {"agent", "ready"}}}``.

        ``state``/``agent`` is ``running``, ``frozen`` or ``stopped``; ``ready`` is the Node's
        Ready condition status (``True``/``False``/``Unknown``) or ``None`` when unreadable.
        """
        self._store.load()

        def st(name: str) -> str:
            ref = self._store.process(name)
            if ref is None or not ref.alive():
                return "stopped"
            return "frozen" if ref.stopped() else "running"

        pids = self._state.get("pids", {})
        comps = {n: {"pid": pids.get(n), "state": st(n)} for n in CONTROL_PLANE}
        ready: dict[str, str] = {}
        if comps["kube-apiserver"]["state"] == "running":
            try:
                for n in json.loads(self.kubectl("get", "nodes", "-o", "json", timeout=10))["items"]:
                    conds = {c["type"]: c["status"] for c in n["status"].get("conditions", [])}
                    ready[n["metadata"]["name"]] = conds.get("Ready")
            except (ClusterError, subprocess.TimeoutExpired, ValueError):
                pass
        nodes = {n: {"pid": pids.get(n), "agent": st(n), "ready": ready.get(n)} for n in self.nodes}
        return {"state_dir": str(self.state_dir), "server": self.server, "kubeconfig": str(self.kubeconfig),
                "components": comps, "nodes": nodes}
