"""The kind bed of ``lifeline bench operator``: cluster, chart install, /metrics through a port-forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

__all__ = ["kind_bed", "node_lifecycle"]

ROOT = Path(__file__).resolve().parents[3]


def node_lifecycle(config: Path) -> dict[str, Any]:
    """The node-lifecycle settings of a kind config (its kubeadm patches), with Kubernetes' defaults
    for what it leaves out. Seconds unless named otherwise."""
    out: dict[str, Any] = {"node_monitor_grace_period": "40s (default)", "node_monitor_period": "5s (default)",
                           "default_not_ready_toleration_seconds": 300, "default_unreachable_toleration_seconds": 300,
                           "kubelet_node_lease_duration_seconds": 40}
    for patch in yaml.safe_load(config.read_text()).get("kubeadmConfigPatches", []):
        doc = yaml.safe_load(patch)
        cm = (doc.get("controllerManager") or {}).get("extraArgs") or {}
        api = (doc.get("apiServer") or {}).get("extraArgs") or {}
        out.update({k.replace("-", "_"): v for k, v in cm.items() if k.startswith("node-monitor")})
        out.update({k.replace("-", "_"): int(v) for k, v in api.items() if "toleration" in k})
        if doc.get("kind") == "KubeletConfiguration" and "nodeLeaseDurationSeconds" in doc:
            out["kubelet_node_lease_duration_seconds"] = doc["nodeLeaseDurationSeconds"]
    out["kubelet_lease_renew_interval_seconds"] = out["kubelet_node_lease_duration_seconds"] / 4
    return out


@contextlib.contextmanager
def kind_bed(work: Path, namespace: str, release: str) -> Iterator[tuple[Any, Any, Any, dict[str, Any]]]:
    """A fresh kind cluster ``lifeline-bench`` (images built or reused; the Lifeline image rebuilt from
    this checkout), deleted afterwards. Yields ``(cluster, install, metrics, node_lifecycle)``."""
    from lifeline.kindbed import chart, engine, images, nodeimage
    from lifeline.kindbed.cluster import KindCluster

    config = ROOT / "kind-config.yaml"
    engine.ensure_engine()
    nodeimage.ensure_node_image()
    images.ensure_services()
    images.ensure_lifeline(ROOT)
    stale = KindCluster("lifeline-bench", work / "kind")
    if stale.exists():
        stale.down()
    cluster = KindCluster.up("lifeline-bench", work / "kind", config=config)
    try:
        cluster.load(*chart.service_images())

        def install() -> None:
            chart.install(cluster, ROOT / "helm" / "lifeline", release=release, namespace=namespace)

        def metrics(pod: Any, port: int) -> str:
            # through the apiserver's pod proxy: the operator binds /metrics to its pod IP only, which
            # a port-forward (it dials the pod's loopback) cannot reach
            return cluster.kubectl("get", "--raw",
                                   f"/api/v1/namespaces/{namespace}/pods/{pod.metadata.name}:{port}/proxy/metrics")

        yield cluster, install, metrics, node_lifecycle(config)
    finally:
        cluster.down()
