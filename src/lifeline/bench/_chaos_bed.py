"""The cluster test bed of ``lifeline bench chaos --bed devcluster``: the chart on a dev cluster, and faults.

:class:`ClusterBed` installs the chart (the operator as a pod, the cluster's Redis and MinIO as external
services) into one namespace of a :class:`~lifeline.devcluster.DevCluster`, reads a job's status, pods
and catalog, and injects the faults of :mod:`._chaos_schedule` the way they happen on Kubernetes:
containers and nodes killed through the dev cluster, a trainer SIGSTOPped, the cluster's Redis restarted
empty, its MinIO down for a few seconds, the operator pod force-deleted (its Deployment starts another),
and a byte flipped in a copy (:mod:`lifeline.launch._flip`) followed by the failure that reads it.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from lifeline.devcluster import ProcessRef
from lifeline.launch import find_slots, flip_file, flip_in_process, flip_offset, flip_stored
from lifeline.launch.faults import FiredFault
from lifeline.launch.inject import Injection

__all__ = ["ClusterBed", "RELEASE", "NAMESPACE", "L2_URI"]

RELEASE, NAMESPACE = "chaos", "lifeline-chaos"
L2_URI = "s3://lifeline/chaos-cluster"
"""Where the trials persist (one prefix; each trial's job has its own name)."""
SRC = Path(__import__("lifeline").__file__).resolve().parents[1]
CHART = SRC.parent / "helm" / "lifeline"


class ClusterBed:
    """The chart installed on ``dc`` (a running dev cluster) in :data:`NAMESPACE`."""

    def __init__(self, dc: Any) -> None:
        from kubernetes import client, config

        self.dc = dc
        api = config.new_client_from_config(str(dc.kubeconfig))
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.lost_nodes: set[str] = set()
        self._minio_timer: threading.Timer | None = None

    # ------------------------------------------------------------------ setup
    def install(self, *, timeout: float = 300.0) -> None:
        """Create the namespace and the ``lifeline`` bucket, ``helm install`` the chart (operator code
        from this checkout) and wait for the operator pod to be Ready."""
        from minio import Minio

        from lifeline._poll import wait_for

        s3 = Minio(self.dc.minio_endpoint, self.dc.minio_access_key, self.dc.minio_secret_key, secure=False)
        if not s3.bucket_exists("lifeline"):
            s3.make_bucket("lifeline")
        self.dc.create_namespace(NAMESPACE)
        self.dc.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                     "--set", f"redis.external.url={self.dc.redis_url}",
                     "--set", f"objectStorage.external.endpoint={self.dc.minio_endpoint}",
                     "--set", f"objectStorage.accessKey={self.dc.minio_access_key}",
                     "--set", f"objectStorage.secretKey={self.dc.minio_secret_key}",
                     "--set", "operator.resyncSeconds=2", "--set", "operator.metricsService.enabled=false",
                     "--set", "operator.extraEnv[0].name=PYTHONPATH", "--set", f"operator.extraEnv[0].value={SRC}",
                     timeout=timeout)
        wait_for(self.operator_ready, timeout, "the operator pod to be Ready", 0.5)

    def operator_ready(self) -> bool:
        """Whether an operator pod (not being deleted) is Ready."""
        return any(p.metadata.deletion_timestamp is None and any(
            c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            for p in self.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=operator").items)

    # ------------------------------------------------------------------ observation
    def apply(self, body: dict) -> None:
        """Create the TrainingJob ``body``."""
        self.custom.create_namespaced_custom_object("lifeline.dev", "v1alpha1", NAMESPACE, "trainingjobs", body)

    def delete(self, name: str) -> None:
        """Delete the TrainingJob ``name`` (its pods and Secret go with it); absent is fine."""
        from kubernetes.client import ApiException

        try:
            self.custom.delete_namespaced_custom_object("lifeline.dev", "v1alpha1", NAMESPACE, "trainingjobs", name)
        except ApiException as err:
            if err.status != 404:
                raise

    def status(self, name: str) -> dict[str, Any]:
        """The job's status (``{}`` before the operator wrote one)."""
        obj = self.custom.get_namespaced_custom_object("lifeline.dev", "v1alpha1", NAMESPACE, "trainingjobs", name)
        return obj.get("status") or {}

    def pods(self, name: str) -> dict[int, Any]:
        """rank -> the job's live pod (not being deleted)."""
        items = self.core.list_namespaced_pod(NAMESPACE, label_selector=f"lifeline.dev/job={name}").items
        return {int(p.metadata.labels["lifeline.dev/rank"]): p for p in items if p.metadata.deletion_timestamp is None}

    def secret(self, name: str) -> str:
        """The job's HMAC key (its Secret's ``hmac-key``)."""
        import base64

        data = self.core.read_namespaced_secret(f"{name}-lifeline", NAMESPACE).data
        return base64.b64decode(data["hmac-key"]).decode()

    def pod_dir(self, pod: Any) -> Path:
        """The pod's directory on its process node."""
        return self.dc.node_dir(pod.spec.node_name) / "pods" / pod.metadata.uid

    def arena_dir(self, pod: Any) -> Path | None:
        """The directory of the pod's arena slot files (its Memory emptyDir on the node), if any."""
        found = sorted((self.dc.shm_root / pod.spec.node_name / pod.metadata.uid).rglob("slot-000.bin"))
        return found[0].parent if found else None

    def process(self, pod: Any, container: str) -> ProcessRef | None:
        """``container``'s process (``None`` when not running). Signal it through the ref: its pid file
        may outlive it by a moment, and the pid may name another process by then."""
        path = self.pod_dir(pod) / "containers" / f"{container}.pid"
        try:
            ref = ProcessRef.parse(path.read_text())
        except (OSError, ValueError):
            return None
        return ref if ref.alive() else None

    # ------------------------------------------------------------------ faults
    def fire(self, inj: Injection, name: str, catalog: Any, step: int) -> FiredFault:
        """Inject ``inj`` into job ``name`` now; returns its record (``note`` says what did not work)."""
        rec = FiredFault(inj, time.time(), step, recovers=inj.kind not in ("redis", "minio", "operator"))
        try:
            getattr(self, f"_{inj.kind}")(inj, rec, name, catalog)
        except Exception as err:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
            rec.note = f"{type(err).__name__}: {err}"[:300]
        return rec

    def _kill(self, name: str, rank: int, container: str) -> None:
        self.dc.kill_container(f"{name}-{rank}", container, namespace=NAMESPACE)

    def _node_of(self, name: str, rank: int) -> str:
        return self.pods(name)[rank].spec.node_name

    def _lose_node(self, node: str, rec: FiredFault) -> None:
        self.dc.kill_node(node)
        self.lost_nodes.add(node)
        rec.nodes.append(node)

    def _trainer(self, inj, rec, name, catalog) -> None:
        self._kill(name, inj.rank, "trainer")

    def _sidecar(self, inj, rec, name, catalog) -> None:
        self._kill(name, inj.rank, "sidecar")

    def _node(self, inj, rec, name, catalog) -> None:
        self._lose_node(self._node_of(name, inj.rank), rec)

    def _hang(self, inj, rec, name, catalog) -> None:
        ref = self.process(self.pods(name)[inj.rank], "trainer")
        if ref is None or not ref.signal(signal.SIGSTOP):
            raise RuntimeError(f"rank {inj.rank}'s trainer is not running")

    def _redis(self, inj, rec, name, catalog) -> None:
        self.dc.kill_service("redis")
        self.dc.start_service("redis")  # empty: the operator and the sidecars rebuild the catalog

    def _minio(self, inj, rec, name, catalog) -> None:
        self.dc.kill_service("minio")
        self._minio_timer = threading.Timer(inj.outage_seconds, self.dc.start_service, args=("minio",))
        self._minio_timer.start()

    def _operator(self, inj, rec, name, catalog) -> None:
        self.dc.kubectl("delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator",
                        "--wait=false", "--grace-period=0", "--force", check=False)

    def _copies(self, name: str, rank: int, catalog: Any, pod: Any):
        """``(step, meta, slot path, blob)`` of ``rank``'s verified L0 copies, newest first."""
        from lifeline.checkpoint import ShardMetadata

        arena = self.arena_dir(pod)
        if arena is None:
            return
        for step in sorted(catalog.steps(), reverse=True)[:4]:
            raw = catalog.meta(step, rank)
            if raw is None:
                continue
            meta = ShardMetadata.from_json(raw)
            for path, blob in find_slots(arena, meta):
                yield step, meta, path, blob

    def _flip(self, inj, rec, name, catalog) -> None:
        pods = self.pods(name)
        pod = pods[inj.rank]
        if inj.tier == "L0":
            self._kill(name, inj.rank, "trainer")
            time.sleep(1.0)  # the save handed over before the kill is sealed and filed
            for step, meta, path, _ in self._copies(name, inj.rank, catalog, pod):
                flip_file(path, flip_offset(meta))
                rec.copies.append({"step": step, "rank": inj.rank, "tier": "L0", "holder": inj.rank,
                                   "where": str(path)})
        elif inj.tier == "L1":
            self._lose_node(pod.spec.node_name, rec)
            time.sleep(1.0)
            for step, meta, _, blob in self._copies(name, inj.rank, catalog, pod):
                for h in sorted(catalog.holders(step, inj.rank), key=lambda h: h.holder or 0):
                    holder = pods.get(h.holder) if h.tier == "L1" else None
                    ref = self.process(holder, "sidecar") if holder is not None else None
                    pid = ref.pid if ref is not None else None
                    if pid and flip_in_process(pid, blob, flip_offset(meta)):
                        rec.copies.append({"step": step, "rank": inj.rank, "tier": "L1", "holder": h.holder,
                                           "where": f"sidecar pid {pid}"})
                if rec.copies:
                    break
        else:
            self._flip_l2(inj, rec, name, catalog, pods)
        if not rec.copies and not rec.note:
            rec.note = f"no {inj.tier} copy of rank {inj.rank} found"

    def _flip_l2(self, inj, rec, name, catalog, pods) -> None:
        from lifeline.checkpoint import list_steps, read_manifest

        storage, prefix = self.storage()
        deadline = time.monotonic() + 30.0  # a first checkpoint's upload may lag the step that made it due
        while not list_steps(storage, prefix, name) and time.monotonic() < deadline:
            time.sleep(0.2)
        rec.at = time.time()
        holders = {h.holder for s in sorted(catalog.steps())[-3:] for h in catalog.holders(s, inj.rank)
                   if h.tier == "L1" and h.holder is not None}
        for rank in sorted({inj.rank} | holders):  # first: the checkpoint flipped is then the newest
            if rank in pods:
                self._lose_node(pods[rank].spec.node_name, rec)
        time.sleep(1.0)  # a commit under way by a surviving sidecar lands first
        steps = list_steps(storage, prefix, name)
        if steps:
            manifest = read_manifest(storage, prefix, name, max(steps))
            c = max((ref.chunk for t in manifest.tensors.values() for ref in t.chunks if ref.rank == inj.rank),
                    key=lambda c: (c.byte_length, -c.byte_offset))
            key = flip_stored(storage, prefix, name, max(steps), inj.rank, c.byte_offset + c.byte_length // 2)
            rec.copies.append({"step": max(steps), "rank": inj.rank, "tier": "L2", "holder": None, "where": key})

    # ------------------------------------------------------------------ storage and clean-up
    def storage(self) -> tuple[Any, str]:
        """``(storage, prefix)`` of the trials' L2 URI in the cluster's MinIO."""
        from lifeline.checkpoint import StorageOptions, storage_from_uri

        return storage_from_uri(L2_URI, StorageOptions(endpoint=self.dc.minio_endpoint,
                                                       access_key=self.dc.minio_access_key,
                                                       secret_key=self.dc.minio_secret_key))

    def heal(self, *, timeout: float = 180.0) -> None:
        """Bring back every node a trial killed and a MinIO still down; wait until all are Ready."""
        if self._minio_timer is not None:
            self._minio_timer.join()
            self._minio_timer = None
        for node in sorted(self.lost_nodes):
            self.dc.start_node(node)
        if self.lost_nodes:
            self.dc.wait_nodes_ready(timeout=timeout)
        self.lost_nodes.clear()

