"""Helpers for dev-cluster tests: JSON reads through kubectl and condition polling with deadlines."""

from __future__ import annotations

import json
import time
import urllib.request

import yaml


def get(cluster, *args: str) -> dict:
    """``kubectl get ... -o json`` as a dict."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


def apply(cluster, namespace: str, *docs: dict) -> None:
    """``kubectl apply`` the given objects in ``namespace``."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def await_(cond, *, timeout: float, what: str, interval: float = 0.25):
    """Poll ``cond()`` until truthy (exceptions count as not yet); fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as err:  # noqa: BLE001
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


def node_ready(cluster, node: str) -> str | None:
    """The Ready condition status of ``node`` (``True``/``False``/``Unknown``)."""
    for c in get(cluster, "node", node)["status"].get("conditions", []):
        if c["type"] == "Ready":
            return c["status"]
    return None


def ready_pods(cluster, namespace: str, selector: str) -> list[dict]:
    """Pods matching ``selector`` that are Ready and not terminating."""
    pods = get(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]


def http_get(url: str, timeout: float = 2.0) -> str:
    """GET ``url``; the body as text."""
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read().decode()


def pod(name: str, script: str, **spec) -> dict:
    """A single-container pod running ``python -c script``."""
    container = {"name": "main", "image": "lifeline:dev", "command": ["python", "-c", script]}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                     "containers": [container], **spec}}


def phase(cluster, namespace: str, name: str) -> str:
    """The pod's phase."""
    return get(cluster, "pod", name, "-n", namespace)["status"].get("phase", "")
