"""A kind cluster of locally built node images: create, load images, inspect, inject faults, delete.

``KindCluster.up`` runs the kind CLI (built from source) with the ``docker`` wrapper first on
its PATH (``node/docker``: no ``--privileged``), ``kind create cluster`` from
``kind-config.yaml``, then configures pod networking (``cni.configure``) and waits for every
node to be Ready and for CoreDNS. The kubeconfig is ``<state_dir>/kubeconfig`` (the API server
on a loopback port that kind publishes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lifeline._poll import wait_for
from lifeline.devcluster import build as devbuild
from lifeline.errors import ClusterError
from lifeline.kindbed import cni, gobuild
from lifeline.kindbed.engine import docker, docker_bin, ensure_engine

__all__ = ["KindCluster", "DEFAULT_CONFIG"]

DEFAULT_CONFIG = Path("kind-config.yaml")
_WRAPPER = Path(__file__).parent / "node" / "docker"
_LOAD_CHUNK = 1 << 20
"""Bytes read from ``docker save`` at a time and written to every node's import."""


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _containerd_name(ref: str) -> str:
    """A docker image reference as containerd names it (``lifeline:dev`` -> ``docker.io/library/lifeline:dev``)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if "/" in ref else f"docker.io/library/{ref}"


class KindCluster:
    """A kind cluster named ``name`` whose files (kubeconfig, the docker wrapper) live in ``state_dir``.

    Node names are their container names (``<name>-control-plane``, ``<name>-worker``, ...).
    """

    def __init__(self, name: str = "lifeline", state_dir: Path | str = ".state/kind") -> None:
        self.name = name
        self.state_dir = Path(state_dir).resolve()
        self.kubeconfig = self.state_dir / "kubeconfig"

    # --- tools -----------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        bindir = self.state_dir / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        wrapper = bindir / "docker"
        if not wrapper.exists() or wrapper.read_bytes() != _WRAPPER.read_bytes():
            shutil.copy(_WRAPPER, wrapper)
            wrapper.chmod(0o755)
        return {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}",
                "LIFELINE_REAL_DOCKER": docker_bin(), "KUBECONFIG": str(self.kubeconfig)}

    def kind(self, *args: str, check: bool = True, timeout: float = 900) -> str:
        """Run the kind CLI (through the docker wrapper); returns its stdout. Raises ClusterError."""
        exe = devbuild.ensure(gobuild.KIND) / "kind"
        proc = subprocess.run([str(exe), *args], env=self._env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kind {' '.join(args[:3])} failed (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}", key="kind")
        return proc.stdout

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        """Run the locally built kubectl against this cluster; returns stdout. Raises ClusterError."""
        exe = devbuild.ensure(gobuild.KUBERNETES_NODE) / "kubectl"
        proc = subprocess.run([str(exe), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:4])} failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-3000:]}", key="kubectl")
        return proc.stdout

    def get(self, *args: str) -> dict:
        """``kubectl get ARGS -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def helm(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        """Run helm (built from source by the dev cluster's build) against this cluster."""
        exe = devbuild.ensure("helm") / "helm"
        home = self.state_dir / "helm"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
        proc = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"helm {' '.join(args[:3])} failed: {(proc.stdout + proc.stderr)[-3000:]}", key="helm")
        return proc.stdout

    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for this cluster (admin)."""
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    # --- lifecycle ---------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether kind knows a cluster of this name (its node containers exist)."""
        return self.name in self.kind("get", "clusters").split()

    @classmethod
    def up(cls, name: str = "lifeline", state_dir: Path | str = ".state/kind", *,
           config: Path | str = DEFAULT_CONFIG, timeout: float = 600) -> KindCluster:
        """Create the cluster (or reuse a running one of that name), network it, await it Ready.

        The node image named in ``config`` must exist locally (``lifeline kind build``).

        Raises:
            ClusterError: kind failed, or nodes/CoreDNS were not Ready within ``timeout`` seconds.
        """
        ensure_engine()
        c = cls(name, state_dir)
        c.state_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if c.exists():
            c.kind("export", "kubeconfig", "--name", name, "--kubeconfig", str(c.kubeconfig))
        else:
            _log(f"[kind] creating cluster {name} from {config}")
            c.kind("create", "cluster", "--name", name, "--config", str(config), "--kubeconfig",
                   str(c.kubeconfig), "--retain", timeout=timeout)
        c.network(timeout=timeout)
        _log(f"[kind] cluster {name} Ready in {time.monotonic() - t0:.0f}s (KUBECONFIG={c.kubeconfig})")
        return c

    def network(self, timeout: float = 300) -> None:
        """Configure pod networking on every node (see ``cni``), then await nodes Ready and CoreDNS."""
        def with_cidrs():
            items = self.get("nodes")["items"]
            return items if items and all(n["spec"].get("podCIDR") for n in items) else None

        cni.configure(wait_for(with_cidrs, timeout, "every node's pod CIDR", 1.0), log=_log)
        self.kubectl("wait", "--for=condition=Ready", "nodes", "--all", f"--timeout={int(timeout)}s",
                     timeout=timeout + 30)
        self.kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", f"--timeout={int(timeout)}s",
                     timeout=timeout + 30)

    def load(self, *images: str, nodes: list[str] | None = None) -> None:
        """Load local images into the nodes' containerd (default: the workers), as ``kind load
        docker-image`` does but streamed (``docker save | ctr images import``, no temporary tar),
        and drop what a reloaded tag replaced: every name of the old image (its ``sha256:<id>``
        alias included), so containerd collects its layers (a Lifeline image is 1.7 GB a node).
        (``--compress-blobs`` would keep another 1 GB less per worker; measured here under load it
        made a load of three workers take 17.5 min instead of ~2.)

        Raises:
            ClusterError: ``docker save`` or the import on a node failed (every failed node named).
        """
        wanted = [_containerd_name(i) for i in images]
        targets = list(nodes if nodes is not None else self.workers())
        before = {node: self._node_images(node) for node in targets}
        # one `docker save` streamed to every node's import at once: the image is read and tarred
        # once, and the imports (hashing, unpacking) overlap on the cores
        save = subprocess.Popen([docker_bin(), "save", *images], stdout=subprocess.PIPE)
        imports = {node: subprocess.Popen([docker_bin(), "exec", "-i", node, "ctr", "--namespace=k8s.io", "images",
                                           "import", "--snapshotter=overlayfs", "-"], stdin=subprocess.PIPE,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                   for node in targets}
        broken: dict[str, str] = {}
        try:
            while chunk := save.stdout.read(_LOAD_CHUNK):
                for node, imp in imports.items():
                    if node in broken:
                        continue
                    try:
                        imp.stdin.write(chunk)
                    except BrokenPipeError:
                        broken[node] = "its import stopped reading"
        finally:
            save.stdout.close()
            for imp in imports.values():
                try:
                    imp.stdin.close()
                except BrokenPipeError:
                    pass
        saved = save.wait()
        for node, imp in imports.items():
            err = imp.stderr.read().decode(errors="replace")
            if imp.wait() != 0 or saved != 0:
                broken[node] = err[-2000:] or broken.get(node, f"docker save exited {saved}")
        if broken:
            raise ClusterError(f"loading {' '.join(images)} failed: " +
                               "; ".join(f"{n}: {why}" for n, why in sorted(broken.items())), key=min(broken))
        for node in targets:
            after = self._node_images(node)
            replaced = {before[node][w] for w in wanted if w in before[node] and before[node][w] != after.get(w)}
            stale = [name for name, digest in after.items() if digest in replaced]
            if stale:
                docker("exec", node, "ctr", "--namespace=k8s.io", "images", "rm", *stale)
            _log(f"[kind] {node}: loaded {' '.join(images)}" + (f" (dropped {len(stale)} old names)" if stale else ""))

    @staticmethod
    def _node_images(node: str) -> dict[str, str]:
        """Image name -> manifest digest in a node's containerd (namespace k8s.io)."""
        out = docker("exec", node, "ctr", "--namespace=k8s.io", "images", "ls").stdout.splitlines()[1:]
        return {cols[0]: cols[2] for cols in (line.split() for line in out) if len(cols) >= 3}

    def down(self) -> None:
        """Delete the cluster's node containers and network state (``kind delete cluster``)."""
        self.kind("delete", "cluster", "--name", self.name)

    # --- nodes and faults ----------------------------------------------------------------------
    def node_containers(self) -> list[str]:
        """Names of this cluster's node containers, running or not."""
        out = docker("ps", "-a", "--filter", f"label=io.x-k8s.kind.cluster={self.name}", "--format", "{{.Names}}")
        return sorted(out.stdout.split())

    def workers(self) -> list[str]:
        """Worker node names (every node but the control plane)."""
        return [n for n in self.node_containers() if not n.endswith("-control-plane")]

    def kill_node(self, node: str) -> None:
        """``docker kill`` of a node container: its kubelet, containerd and pods die at once."""
        docker("kill", node)

    def kill_container_process(self, pod: str, container: str, namespace: str) -> int:
        """SIGKILL the main process of one container of a pod, from its node (as the OOM killer would).

        Returns the killed process id (in the node's PID namespace). Raises ClusterError.
        """
        p = self.get("pod", pod, "-n", namespace)
        node = p["spec"]["nodeName"]
        cid = next(s["containerID"] for s in p["status"]["containerStatuses"] if s["name"] == container)
        cid = cid.split("://", 1)[1]
        tasks = docker("exec", node, "ctr", "--namespace=k8s.io", "tasks", "ls").stdout
        m = re.search(rf"^{cid}\s+(\d+)\s", tasks, re.MULTILINE)
        if not m:
            raise ClusterError(f"no task for container {container} of pod {pod} on {node}", key=pod)
        docker("exec", node, "kill", "-9", m.group(1))
        return int(m.group(1))

    @contextlib.contextmanager
    def port_forward(self, namespace: str, target: str, port: int, timeout: float = 60) -> Iterator[int]:
        """``kubectl port-forward`` of ``target`` (e.g. ``svc/x``) to a free loopback port, which it yields."""
        exe = devbuild.ensure(gobuild.KUBERNETES_NODE) / "kubectl"
        proc = subprocess.Popen([str(exe), "--kubeconfig", str(self.kubeconfig), "port-forward", "-n", namespace,
                                 "--address", "127.0.0.1", target, f":{port}"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                line = proc.stdout.readline()
                m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
                if m:
                    yield int(m.group(1))
                    return
                if not line or time.monotonic() > deadline:
                    raise ClusterError(f"kubectl port-forward {target} did not start: {line.strip()}", key=target)
        finally:
            proc.kill()
            proc.wait()
