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
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from lifeline.devcluster import _proc, build
from lifeline.devcluster._control_plane import start_control_plane
from lifeline.devcluster._netclaim import claim_net, release_net
from lifeline.devcluster.pki import Pki, write_kubeconfig
from lifeline.errors import ClusterError, ConfigError

__all__ = ["Ports", "DevCluster", "MinioAccess", "STATE_FILE"]

STATE_FILE = "state.json"
_STATE_SUBDIRS = ("etcd", "pki", "kubeconfigs", "nodes", "logs", "redis", "minio", "helm", "kube-cache",
                  "kcm-certs", "scheduler-certs")
_CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "redis", "minio")


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


class DevCluster:
    """Handle on a dev cluster's state directory (running or not).

    Attributes:
        state_dir: absolute path of the state directory.
        kubeconfig: the admin kubeconfig (``system:masters``).
        nodes: node names (``node-1`` ... ``node-N``).
        redis_url: ``redis://127.0.0.1:PORT/0``.
        minio_endpoint, minio_access_key, minio_secret_key: MinIO (plain HTTP).
    """

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        path = self.state_dir / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no dev cluster state in {self.state_dir}; fix: `lifeline devcluster up "
                               f"--state-dir {self.state_dir}`", key=str(path))
        self._state = json.loads(path.read_text())

    # ------------------------------------------------------------------ properties
    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig path."""
        return self.state_dir / "kubeconfig"

    @property
    def ports(self) -> Ports:
        """The ports this cluster was started with."""
        return Ports(**self._state["ports"])

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
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def redis_url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.ports.redis}/0"

    @property
    def minio_endpoint(self) -> str:
        """``127.0.0.1:PORT`` (plain HTTP)."""
        return f"127.0.0.1:{self.ports.minio}"

    @property
    def minio_access_key(self) -> str:
        """MinIO root user."""
        return self._state["minio"]["access_key"]

    @property
    def minio_secret_key(self) -> str:
        """MinIO root password."""
        return self._state["minio"]["secret_key"]

    @property
    def minio(self) -> MinioAccess:
        """MinIO endpoint and credentials (the same attribute names as :class:`MinioServer`)."""
        return MinioAccess(self.minio_endpoint, self.minio_access_key, self.minio_secret_key)

    @property
    def shm_root(self) -> Path:
        """``/dev/shm`` directory of Memory-medium emptyDir volumes (removed by :meth:`down`)."""
        return Path(self._state["shm_root"])

    def node_dir(self, node: str) -> Path:
        """State directory of ``node`` (pods, logs, pid files)."""
        self._check_node(node)
        return self.state_dir / "nodes" / node

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, state_dir: str | Path = ".state/devcluster", *, nodes: int = 3,
           ports: Ports | str | None = None, node_cpu: str = "4", node_memory: str = "8Gi",
           log=None, timeout: float = 120.0) -> DevCluster:
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
        state["net"] = claim_net(state_dir, _is_running)
        for sub in _STATE_SUBDIRS:  # a stopped cluster's leftovers: `up` always starts fresh
            shutil.rmtree(state_dir / sub, ignore_errors=True)
        (state_dir / STATE_FILE).write_text(json.dumps(state, indent=1))
        self = cls(state_dir)
        try:
            start_control_plane(self, bins, log, timeout)
            for i, name in enumerate(self.nodes, start=1):
                self._issue_node_credentials(name)
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

    def _load(self) -> None:
        """Re-read state.json: another process (the CLI) may have changed pids since."""
        self._state = json.loads((self.state_dir / STATE_FILE).read_text())

    def _save(self) -> None:
        tmp = self.state_dir / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self._state, indent=1))
        tmp.replace(self.state_dir / STATE_FILE)

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> int:
        p = _proc.spawn(argv, log=self.state_dir / "logs" / f"{name}.log", env=env, cwd=self.state_dir)
        self._state["pids"][name] = p.pid
        self._save()
        return p.pid

    def _wait_http(self, name: str, url: str, timeout: float, ctx: ssl.SSLContext | None = None) -> None:
        pid = self._state["pids"][name]

        def check() -> None:
            if not _proc.alive(pid):
                tail = (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ClusterError(f"{name} exited during startup; log {self.state_dir}/logs/{name}.log:\n{tail}")

        def ok() -> bool:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:  # noqa: S310 - loopback
                return r.status == 200

        _proc.wait_until(ok, timeout=timeout, what=f"{name} at {url}", check=check, interval=0.1)

    def _issue_node_credentials(self, name: str) -> None:
        pki = Pki(self.state_dir / "pki")
        pki.issue(f"node-{name}-serving", f"system:node:{name}", server=True, dns=(name, "localhost"),
                  ips=("127.0.0.1",))
        crt, key = pki.issue(f"node-{name}", f"system:node:{name}", orgs=("system:nodes",))
        write_kubeconfig(self.state_dir / "kubeconfigs" / f"{name}.kubeconfig", server=self.server,
                         ca=pki.ca_cert, user=f"system:node:{name}", cert=crt, key=key)

    def start_node(self, name: str, *, index: int | None = None) -> int:
        """(Re)start the agent of node ``name``; returns its pid. Raises ClusterError if it is running."""
        self._load()
        self._check_node(name)
        pid = self._state["pids"].get(name)
        if pid and _proc.alive(pid):
            raise ClusterError(f"node {name} is already running (pid {pid})", key=name)
        index = index or self.nodes.index(name) + 1
        res = self._state["node_resources"]
        return self._spawn(name, [
            sys.executable, "-m", "lifeline", "node", "run", "--name", name, "--index", str(index),
            "--kubeconfig", str(self.state_dir / "kubeconfigs" / f"{name}.kubeconfig"),
            "--state-dir", str(self.node_dir(name)), "--shm-dir", str(self.shm_root / name),
            "--net", str(self._state["net"]), "--cpu", res["cpu"], "--memory", res["memory"],
            "--server", self.server, "--ca", str(self.state_dir / "pki" / "ca.crt"),
            "--serving-cert", str(self.state_dir / "pki" / f"node-{name}-serving.crt"),
            "--serving-key", str(self.state_dir / "pki" / f"node-{name}-serving.key"),
        ])

    def down(self, *, log=None) -> None:
        """Stop every process of the cluster (nodes and their pods first) and remove its /dev/shm files.

        Leaves the state directory (logs, etcd data) in place; nothing outside it remains.
        """
        log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._load()
        pids = self._state.get("pids", {})
        for name in self.nodes:
            if name in pids:
                _proc.stop_group(pids[name], grace=10)
            for pgid in self._pod_process_groups(name):
                _proc.stop_group(pgid, grace=2)
        for name in reversed(_CONTROL_PLANE):
            if name in pids:
                _proc.stop_group(pids[name], grace=10)
        shutil.rmtree(self.shm_root, ignore_errors=True)
        if "net" in self._state:
            release_net(self._state["net"], self.state_dir)
        self._state["pids"] = {}
        self._save()
        log(f"[down] dev cluster in {self.state_dir} stopped")

    def _pod_process_groups(self, node: str) -> list[int]:
        out = []
        for f in (self.state_dir / "nodes" / node / "pods").glob("*/containers/*.pid"):
            try:
                out.append(int(f.read_text().strip()))
            except (OSError, ValueError):
                continue
        return out

    def _check_node(self, node: str) -> None:
        if node not in self._state["nodes"]:
            raise ClusterError(f"unknown node {node!r}; this cluster's nodes are "
                               f"{', '.join(self._state['nodes'])}", key=node)

    # ------------------------------------------------------------------ faults
    def kill_node(self, node: str) -> None:
        """SIGKILL node ``node``'s agent and every process of its pods: its Lease stops being renewed."""
        self._check_node(node)
        self._load()
        pid = self._state["pids"].get(node)
        if pid:
            _proc.kill_group(pid, signal.SIGKILL)
        for pgid in self._pod_process_groups(node):
            _proc.kill_group(pgid, signal.SIGKILL)

    def freeze_node(self, node: str, *, thaw: bool = False) -> None:
        """Stop (SIGSTOP) node ``node``'s agent so its heartbeats stop while pod processes keep running;
        ``thaw=True`` resumes it (SIGCONT)."""
        self._check_node(node)
        self._load()
        pid = self._state["pids"].get(node)
        if not pid or not _proc.alive(pid):
            raise ClusterError(f"node {node} is not running; fix: `lifeline devcluster start-node {node}`",
                               key=node)
        os.kill(pid, signal.SIGCONT if thaw else signal.SIGSTOP)

    def kill_container(self, pod: str, container: str | None = None, *, namespace: str = "default") -> None:
        """SIGKILL one container's process group (the node restarts it per the pod's restartPolicy)."""
        d = self._pod_dir(pod, namespace)
        names = sorted(p.stem for p in (d / "containers").glob("*.pid"))
        if container is None:
            if len(names) != 1:
                raise ConfigError(f"pod {namespace}/{pod} has containers {names}; pass -c NAME",
                                  field="container")
            container = names[0]
        pidf = d / "containers" / f"{container}.pid"
        if not pidf.exists():
            raise ConfigError(f"pod {namespace}/{pod} has no running container {container!r}; "
                              f"running: {names}", field="container")
        _proc.kill_group(int(pidf.read_text()), signal.SIGKILL)

    def _pod_dir(self, pod: str, namespace: str) -> Path:
        obj = json.loads(self.kubectl("get", "pod", pod, "-n", namespace, "-o", "json"))
        node, uid = obj["spec"].get("nodeName"), obj["metadata"]["uid"]
        if not node:
            raise ClusterError(f"pod {namespace}/{pod} is not scheduled yet", key=pod)
        return self.node_dir(node) / "pods" / uid

    def log_path(self, pod: str, container: str | None = None, *, namespace: str = "default",
                 previous: bool = False) -> Path:
        """The log file of a container's current (or previous) run."""
        d = self._pod_dir(pod, namespace) / "logs"
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

    # ------------------------------------------------------------------ tools
    def _tool_env(self) -> dict[str, str]:
        sd = self.state_dir
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "HELM_CACHE_HOME": str(sd / "helm" / "cache"), "HELM_CONFIG_HOME": str(sd / "helm" / "config"),
                "HELM_DATA_HOME": str(sd / "helm" / "data")}

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60) -> str:
        """Run ``kubectl`` against this cluster; returns stdout. Raises ClusterError on failure when ``check``."""
        cmd = ["kubectl", f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.state_dir / 'kube-cache'}",
               *args]
        return self._run_tool(cmd, check=check, input=input, timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """Run the cluster's ``helm`` (built from source) against it; returns stdout."""
        return self._run_tool([str(self.helm_binary), *args], check=check, input=None, timeout=timeout)

    def _run_tool(self, cmd: list[str], *, check: bool, input: str | None, timeout: float) -> str:
        p = subprocess.run(cmd, env=self._tool_env(), input=input, text=True, capture_output=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise ClusterError(f"`{' '.join(cmd[:1] + list(cmd[3 if cmd[0] == 'kubectl' else 1:]))}` "
                               f"failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        return p.stdout

    def api_client(self):
        """A :class:`kubernetes.client.ApiClient` with admin credentials."""
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    def create_namespace(self, name: str, *, timeout: float = 30) -> None:
        """Create namespace ``name`` and wait until its ``default`` ServiceAccount exists."""
        self.kubectl("create", "namespace", name)
        _proc.wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", name,
                                              "--ignore-not-found", "-o", "name").strip(),
                         timeout=timeout, what=f"ServiceAccount {name}/default", interval=0.2)

    def wait_nodes_ready(self, *, timeout: float = 60, nodes: list[str] | None = None) -> None:
        """Wait until every node in ``nodes`` (default: all) reports Ready=True."""
        want = set(nodes or self.nodes)

        def ready() -> bool:
            items = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            ok = {n["metadata"]["name"] for n in items
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
            return want <= ok

        _proc.wait_until(ready, timeout=timeout, what=f"nodes {sorted(want)} Ready", interval=0.25,
                         check=self._check_nodes_alive(want))

    def _check_nodes_alive(self, want: set[str]):
        def check() -> None:
            for n in want:
                pid = self._state["pids"].get(n)
                if pid and not _proc.alive(pid):
                    tail = (self.state_dir / "logs" / f"{n}.log").read_text(errors="replace")[-3000:]
                    raise ClusterError(f"node agent {n} exited; log {self.state_dir}/logs/{n}.log:\n{tail}",
                                       key=n)
        return check

    # ------------------------------------------------------------------ status
    def running_components(self) -> list[str]:
        """Names of the cluster's processes that are alive now."""
        self._load()
        return [n for n, pid in self._state.get("pids", {}).items() if _proc.alive(pid)]

    def status(self) -> dict:
        """``{"components": {name: {"pid", "state"}}, "nodes": {name: {"agent", "ready"}}}``.

        ``state``/``agent`` is ``running``, ``frozen`` or ``stopped``; ``ready`` is the Node's
        Ready condition status (``True``/``False``/``Unknown``) or ``None`` when unreadable.
        """
        self._load()

        def st(pid: int | None) -> str:
            if not pid or not _proc.alive(pid):
                return "stopped"
            return "frozen" if _proc.stopped(pid) else "running"

        pids = self._state.get("pids", {})
        comps = {n: {"pid": pids.get(n), "state": st(pids.get(n))} for n in _CONTROL_PLANE}
        ready: dict[str, str] = {}
        if comps["kube-apiserver"]["state"] == "running":
            try:
                for n in json.loads(self.kubectl("get", "nodes", "-o", "json", timeout=10))["items"]:
                    conds = {c["type"]: c["status"] for c in n["status"].get("conditions", [])}
                    ready[n["metadata"]["name"]] = conds.get("Ready")
            except (ClusterError, subprocess.TimeoutExpired, ValueError):
                pass
        nodes = {n: {"pid": pids.get(n), "agent": st(pids.get(n)), "ready": ready.get(n)} for n in self.nodes}
        return {"state_dir": str(self.state_dir), "server": self.server, "kubeconfig": str(self.kubeconfig),
                "components": comps, "nodes": nodes}


def _is_running(state_dir: Path) -> bool:
    try:
        return bool(DevCluster(state_dir).running_components())
    except (ClusterError, OSError, ValueError):
        return False
