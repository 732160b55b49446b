"""The process-node agent (``lifeline node run``): a small kubelet that runs pods as local processes.

It authenticates as ``system:node:<name>`` (group ``system:nodes``), so the API server's
Node authorizer and NodeRestriction admission limit it exactly as they limit a kubelet.
It registers its Node (allocatable cpu/memory/pods, Ready condition, addresses), renews
its Lease in ``kube-node-lease`` every 2 s, refreshes its Ready condition every 5 s, and
list-watches the pods bound to it (field selector ``spec.nodeName``), handing each to a
:class:`~lifeline.devcluster.node.pod.PodWorker`.

Pod IPs are loopback addresses ``127.<net>.<8*(index-1) + hi>.<lo>`` (``hi`` 0..7, ``lo``
1..254): ``net`` is the cluster's second octet, claimed host-wide by ``up`` so that two dev
clusters on one machine never hand out the same address; the per-node counter is kept in
``<state-dir>/ipam`` (unique across agent restarts) and skips addresses still in use.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from lifeline.devcluster.node._common import now_rfc3339
from lifeline.devcluster.node._common import raw as _raw
from lifeline.devcluster.node.logserver import start_log_server
from lifeline.devcluster.node.pod import PodWorker

__all__ = ["NodeAgent"]

_LEASE_PERIOD, _STATUS_PERIOD, _LEASE_DURATION = 2.0, 5.0, 40


def _micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """One process node. ``run()`` blocks until SIGTERM/SIGINT, then stops its pods' processes.

    Args:
        name: node name.
        index: node index 1..32 (selects the node's block of pod IPs).
        net: the cluster's second octet of pod IPs (1..254).
        kubeconfig: the node's client-certificate kubeconfig.
        state_dir: per-node directory (pods, logs, pid files, ipam counter).
        shm_dir: per-node directory under /dev/shm for Memory-medium emptyDirs.
        server, ca: API server URL and CA certificate path (written into pods' kubeconfigs).
        serving_cert, serving_key: TLS certificate of the node's log endpoint (``kubectl logs``);
            without them the endpoint is not served.
        cpu, memory, pods: allocatable resources (Kubernetes quantities as strings).
    """

    def __init__(self, *, name: str, index: int, net: int, kubeconfig: Path, state_dir: Path, shm_dir: Path,
                 server: str, ca: Path, serving_cert: Path | None = None, serving_key: Path | None = None,
                 cpu: str = "4", memory: str = "8Gi", pods: str = "110") -> None:
        self.name, self.index, self.net = name, int(index), int(net)
        self.state_dir, self.shm_dir = Path(state_dir), Path(shm_dir)
        self.server, self.ca = server, Path(ca)
        self.allocatable = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"}
        self.host_ip = "127.0.0.1"
        self.serving = (serving_cert, serving_key) if serving_cert and serving_key else None
        self.kubelet_port = 0
        self.api = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.workers: dict[str, PodWorker] = {}
        self._stop = threading.Event()
        self._ip_lock = threading.Lock()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "pods").mkdir(exist_ok=True)
        self.shm_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------- helpers
    def log(self, line: str) -> None:
        """Write a timestamped line to the agent's log (stderr)."""
        print(f"{now_rfc3339()} {self.name}: {line}", file=sys.stderr, flush=True)

    def raw(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict:
        """Call a kubernetes client method and return the JSON body as a dict (camelCase keys)."""
        return _raw(fn, *args, **kw)

    def allocate_ip(self) -> str:
        """Next free pod IP of this node's block (see the module docstring); 2032 addresses per node."""
        with self._ip_lock:
            f = self.state_dir / "ipam"
            n = int(f.read_text()) if f.exists() else -1
            in_use = {w.pod_ip for w in list(self.workers.values())}
            for _ in range(8 * 254):
                n = (n + 1) % (8 * 254)
                ip = f"127.{self.net}.{8 * (self.index - 1) + n // 254}.{n % 254 + 1}"
                if ip not in in_use:
                    f.write_text(str(n))
                    return ip
            raise RuntimeError(f"node {self.name} has no free pod IP left (2032 in use)")

    # ----------------------------------------------------------------- node object
    def _conditions(self) -> list[dict]:
        now = now_rfc3339()
        mk = lambda t, s, r, m: {"type": t, "status": s, "reason": r, "message": m,  # noqa: E731
                                 "lastHeartbeatTime": now, "lastTransitionTime": self._since.get(t, now)}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready"):
            self._since.setdefault(t, now)
        return [
            mk("MemoryPressure", "False", "KubeletHasSufficientMemory", "lifeline node has sufficient memory"),
            mk("DiskPressure", "False", "KubeletHasNoDiskPressure", "lifeline node has no disk pressure"),
            mk("PIDPressure", "False", "KubeletHasSufficientPID", "lifeline node has sufficient PID"),
            mk("Ready", "True", "KubeletReady", "lifeline process node is posting ready status"),
        ]

    def _node_status(self) -> dict:
        u = platform.uname()
        return {
            "capacity": self.allocatable, "allocatable": self.allocatable,
            "conditions": self._conditions(),
            "addresses": [{"type": "InternalIP", "address": self.host_ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {"machineID": self.name, "systemUUID": self.name, "bootID": str(os.getpid()),
                         "kernelVersion": u.release, "osImage": "lifeline process node",
                         "containerRuntimeVersion": "lifeline://0.1.0", "kubeletVersion": "v1.32.13-lifeline",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        }

    def register(self) -> None:
        """Create the Node (or refresh its status when it already exists). Raises ApiException on refusal."""
        self._since: dict[str, str] = {}
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": {
                    "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "lifeline.dev/process-node": "true"}},
                "spec": {}, "status": self._node_status()}
        try:
            self.core.create_node(node)
            self.log("registered node")
        except ApiException as err:
            if err.status != 409:
                raise
            self.core.patch_node_status(self.name, {"status": self._node_status()})
            self.log("node already registered; status refreshed")
        self._uid = self.raw(self.core.read_node, self.name)["metadata"]["uid"]

    def _renew_lease(self) -> None:
        try:
            self.coord.patch_namespaced_lease(self.name, "kube-node-lease",
                                              {"spec": {"renewTime": _micro_now(), "holderIdentity": self.name}})
        except ApiException as err:
            if err.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name,
                                                  "uid": self._uid}]},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": _LEASE_DURATION,
                         "renewTime": _micro_now()}})

    def _heartbeat_loop(self) -> None:
        next_status = 0.0
        while not self._stop.is_set():
            try:
                self._renew_lease()
                if time.monotonic() >= next_status:
                    self.core.patch_node_status(self.name, {"status": {"conditions": self._conditions()}})
                    next_status = time.monotonic() + _STATUS_PERIOD
            except Exception as err:  # noqa: BLE001 - API briefly unreachable: keep trying
                self.log(f"heartbeat failed: {err}")
            self._stop.wait(_LEASE_PERIOD)

    # ----------------------------------------------------------------- pods
    def _handle(self, kind: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        w = self.workers.get(uid)
        if kind == "DELETED":
            if w is not None:
                w.shutdown()
                self.workers.pop(uid, None)
            return
        if w is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                return  # finished before this agent started: nothing to run
            w = PodWorker(self, pod)
            self.workers[uid] = w
            if pod["metadata"].get("deletionTimestamp"):
                w.request_delete(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            w.start()
            return
        w.update(pod)
        if pod["metadata"].get("deletionTimestamp"):
            w.request_delete(pod["metadata"].get("deletionGracePeriodSeconds") or 0)

    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={self.name}"
        swept = False
        while not self._stop.is_set():
            try:
                listing = self.raw(self.core.list_pod_for_all_namespaces, field_selector=selector)
                seen = set()
                for pod in listing["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self._handle("MODIFIED", pod)
                if not swept:  # pods deleted while this node was down left their Memory emptyDirs
                    for stale in (d for d in self.shm_dir.glob("*") if d.is_dir() and d.name not in seen):
                        shutil.rmtree(stale, ignore_errors=True)
                    swept = True
                for uid in set(self.workers) - seen:
                    self.workers.pop(uid).shutdown()
                rv = listing["metadata"]["resourceVersion"]
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                   resource_version=rv, timeout_seconds=300, allow_watch_bookmarks=True):
                    if self._stop.is_set():
                        w.stop()
                        break
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._handle(ev["type"], ev["raw_object"])
            except ApiException as err:
                if err.status != 410:
                    self.log(f"pod watch failed: {err.status} {err.reason}; relisting")
                    self._stop.wait(1)
            except Exception as err:  # noqa: BLE001 - reconnect on any stream failure
                self.log(f"pod watch failed: {err!r}; relisting")
                self._stop.wait(1)

    # ----------------------------------------------------------------- main
    def run(self) -> None:
        """Register, then heartbeat and run pods until SIGTERM/SIGINT."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        if self.serving:
            self.kubelet_port = start_log_server(self.state_dir / "pods", self.name, cert=self.serving[0],
                                                 key=self.serving[1], ca=self.ca)
        while not self._stop.is_set():
            try:
                self.register()
                break
            except Exception as err:  # noqa: BLE001 - the API server may still be starting
                self.log(f"registration failed: {err}; retrying")
                self._stop.wait(1)
        threads = [threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
                   threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True)]
        for t in threads:
            t.start()
        while not self._stop.is_set():
            self._stop.wait(1)
        self.log("stopping: terminating pod processes")
        workers = list(self.workers.values())
        for w in workers:
            w.shutdown()
        for w in workers:
            w.join(timeout=10)
        self.log("stopped")


def main_run(**kw) -> None:
    """Entry point of ``lifeline node run`` (see :class:`NodeAgent` for the arguments)."""
    try:
        NodeAgent(**kw).run()
    except Exception:
        traceback.print_exc()
        raise
