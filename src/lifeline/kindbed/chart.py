"""The Lifeline chart on a kind cluster: in-cluster Redis and MinIO from the images built here.

``install`` is ``helm install`` of ``helm/lifeline`` with the chart's defaults except the
image names of Redis and MinIO (built here instead of pulled) and whatever ``values`` adds;
the bucket the example's L2 URI names is created by a one-shot pod of the MinIO image. It
returns once the operator, Redis and MinIO pods are Ready.
"""

from __future__ import annotations

import json
from pathlib import Path

from lifeline._poll import wait_for
from lifeline.errors import ClusterError
from lifeline.kindbed.cluster import KindCluster
from lifeline.kindbed.images import LIFELINE_IMAGE, MINIO_IMAGE, REDIS_IMAGE

__all__ = ["install", "uninstall", "service_images", "ready", "fullname", "make_bucket"]


def service_images() -> list[str]:
    """Every image the chart's pods run on kind: Lifeline (all roles), Redis, MinIO."""
    return [LIFELINE_IMAGE, REDIS_IMAGE, MINIO_IMAGE]


def ready(cluster: KindCluster, namespace: str, component: str) -> bool:
    """Whether some pod ``app.kubernetes.io/component=<component>`` in ``namespace`` is Ready."""
    pods = cluster.get("pods", "-n", namespace, "-l", f"app.kubernetes.io/component={component}")["items"]
    return any(c["type"] == "Ready" and c["status"] == "True" and not p["metadata"].get("deletionTimestamp")
               for p in pods for c in p.get("status", {}).get("conditions", []))


def install(cluster: KindCluster, chart: Path, *, release: str = "lifeline", namespace: str = "lifeline",
            values: dict[str, str] | None = None, bucket: str = "lifeline", timeout: float = 300) -> None:
    """``helm install`` the chart into ``namespace`` (created) and await the operator, Redis and MinIO.

    Args:
        values: extra ``--set`` pairs.
        bucket: S3 bucket to create in the in-cluster MinIO (the L2 URI's bucket).

    Raises:
        ClusterError: helm or kubectl failed. TimeoutError: a pod was not Ready within ``timeout``.
    """
    image, tag = LIFELINE_IMAGE.rsplit(":", 1)
    sets = {"image.repository": image, "image.tag": tag, "redis.internal.image": REDIS_IMAGE,
            "objectStorage.internal.image": MINIO_IMAGE, **(values or {})}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    cluster.helm("install", release, str(chart), "--namespace", namespace, "--create-namespace", *args)
    for component in ("redis", "minio", "operator"):
        wait_for(lambda: ready(cluster, namespace, component), timeout, f"the {component} pod to be Ready", 1.0)
    make_bucket(cluster, namespace, release, bucket)


def fullname(release: str) -> str:
    """The chart's ``lifeline.fullname`` of a release (names of its Services and Secrets)."""
    return release if "lifeline" in release else f"{release}-lifeline"


def make_bucket(cluster: KindCluster, namespace: str, release: str, bucket: str) -> None:
    """Create ``bucket`` in the in-cluster MinIO from a one-shot pod, through the MinIO Service's
    DNS name (CoreDNS) and ClusterIP (kube-proxy). Raises ClusterError."""
    full = fullname(release)
    secret = f"{full}-object-storage"
    script = ("import os\nfrom minio import Minio\n"
              f"m = Minio('{full}-minio.{namespace}.svc.cluster.local:9000', os.environ['AK'], os.environ['SK'], "
              "secure=False)\n"
              f"m.bucket_exists('{bucket}') or m.make_bucket('{bucket}')\nprint('bucket ok')\n")
    spec = {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [{
        "name": "mkbucket", "image": LIFELINE_IMAGE, "command": ["python", "-c", script],
        "env": [{"name": "AK", "valueFrom": {"secretKeyRef": {"name": secret, "key": "access-key"}}},
                {"name": "SK", "valueFrom": {"secretKeyRef": {"name": secret, "key": "secret-key"}}}]}]}}
    last = ""
    for attempt in range(3):  # a Ready MinIO can still refuse the first connection through a new ClusterIP
        name = f"mkbucket-{attempt}"
        cluster.kubectl("run", name, "-n", namespace, "--image", LIFELINE_IMAGE, "--restart=Never",
                        "--overrides", json.dumps(spec))
        try:
            wait_for(lambda: _phase(cluster, namespace, name) in ("Succeeded", "Failed"), 180,
                     f"pod {name} to finish", 1.0)
            last = cluster.kubectl("logs", "-n", namespace, name, check=False)
        finally:
            cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)
        if "bucket ok" in last:
            return
    raise ClusterError(f"creating bucket {bucket} in {full}-minio failed 3 times; last output: {last[-2000:]}",
                       key=bucket)


def _phase(cluster: KindCluster, namespace: str, pod: str) -> str:
    return cluster.kubectl("get", "pod", "-n", namespace, pod, "-o", "jsonpath={.status.phase}", check=False)


def uninstall(cluster: KindCluster, *, release: str = "lifeline", namespace: str = "lifeline") -> None:
    """``helm uninstall`` (waits) and delete the namespace."""
    cluster.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s", check=False)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
