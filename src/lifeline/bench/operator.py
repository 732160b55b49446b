"""``lifeline bench operator``: a TrainingJob on a real cluster, one node killed mid-run.

Two beds (``cluster``):

* ``kind`` (default): a kind cluster (``lifeline.kindbed``: 1 control plane + 3 workers, real
  kubelets and containerd, images built here); the chart with its in-cluster Redis and MinIO;
  the node is killed with ``docker kill`` of its container. Node lifecycle settings (reported
  under ``node_lifecycle``) are kind-config.yaml's.
* ``dev``: the dev cluster (``lifeline.devcluster``: 3 process nodes, loopback Redis and MinIO);
  the node is killed by SIGKILL of its agent and pods.

The run: ``helm install`` the chart, ``kubectl apply`` the TrainingJob, wait for a complete
checkpoint, kill the node of rank 1 and follow the recovery through the API server until
training has resumed and the job has succeeded. Timestamps are taken by polling the API every
``poll`` seconds (their resolution).

Reported (seconds unless named otherwise):

* ``startup``: helm install → operator Ready; apply → every rank's pod created (the operator's
  reaction); apply → the first step in ``status.step``.
* ``node_kill`` (the node of rank 1, or of the first rank whose node runs neither the in-cluster
  Redis nor MinIO): kill → node not Ready in the API; kill → the job ``Recovering`` (failure
  detected and a plan committed); kill → every rank on a healthy node; kill → training resumed
  (the replacing recovery closed and ``status.step`` past its ``fromStep``); and the operator's
  own ``status.recoveries`` records.
* ``reconcile``: the operator's ``lifeline_operator_reconcile_seconds`` histogram scraped from
  its ``/metrics``: count, mean and the bucket bounds holding the median and the 95th percentile.
* ``kubectl``: the text of ``kubectl get tj``, ``kubectl get pods -o wide`` and
  ``kubectl describe tj`` right after training resumed, as a user sees them.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from lifeline._poll import wait_for

__all__ = ["run"]

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "lifeline-bench"
RELEASE = "ll"


def run(*, steps: int = 60, kill_after_step: int = 10, workdir: str | None = None, poll: float = 0.1,
        chart: str | None = None, job_file: str | None = None, cluster: str = "kind") -> dict[str, Any]:
    """Run the benchmark; returns one JSON-ready dict (see the module docstring).

    Args:
        steps: ``spec.steps`` of the job.
        kill_after_step: kill rank 1's node once ``status.completeStep`` reaches this step.
        workdir: directory for the dev cluster's state (default: a new temp dir).
        poll: seconds between API reads (the resolution of every timestamp).
        chart, job_file: the chart directory and TrainingJob YAML (default: this checkout's
            ``helm/lifeline`` and ``examples/gpt-moe.yaml``).
        cluster: ``kind`` or ``dev`` (see the module docstring).

    Raises:
        lifeline.errors.ClusterError: the dev cluster cannot start (binaries: ``lifeline devcluster build``).
        TimeoutError: a phase did not happen in time (the message names it).
    """
    work = Path(workdir or tempfile.mkdtemp(prefix="lifeline-bench-operator-"))
    chart_dir = Path(chart) if chart else ROOT / "helm" / "lifeline"
    body = yaml.safe_load(Path(job_file or ROOT / "examples" / "gpt-moe.yaml").read_text())
    body["spec"]["steps"] = steps
    name = body["metadata"]["name"]
    if cluster == "kind":
        from lifeline.bench._kind import kind_bed

        with kind_bed(work, NAMESPACE, RELEASE) as (bed, install, metrics, lifecycle):
            return _run(bed, install, metrics, body, name, kill_after_step, poll) | {
                "cluster": "kind", "node_lifecycle": lifecycle, "workdir": str(work)}
    from lifeline.devcluster import DevCluster

    dc = DevCluster.up(work / "devcluster", nodes=3, ports="auto")
    try:
        return _run(dc, lambda: _install_dev(dc, chart_dir), _direct_metrics, body, name, kill_after_step,
                    poll) | {"cluster": "dev", "workdir": str(work)}
    finally:
        dc.down()


def _install_dev(dc: Any, chart_dir: Path) -> None:
    """The chart on the dev cluster, with its loopback Redis and MinIO."""
    from minio import Minio

    s3 = Minio(dc.minio_endpoint, dc.minio_access_key, dc.minio_secret_key, secure=False)
    if not s3.bucket_exists("lifeline"):
        s3.make_bucket("lifeline")
    dc.create_namespace(NAMESPACE)
    dc.helm("install", RELEASE, str(chart_dir), "--namespace", NAMESPACE,
            "--set", f"redis.external.url={dc.redis_url}",
            "--set", f"objectStorage.external.endpoint={dc.minio_endpoint}",
            "--set", f"objectStorage.accessKey={dc.minio_access_key}",
            "--set", f"objectStorage.secretKey={dc.minio_secret_key}",
            "--set", "operator.metricsService.enabled=false")  # Endpoints refuse loopback pod IPs


def _direct_metrics(operator_pod: Any, port: int) -> str:
    """The operator's /metrics text, fetched at its pod IP (reachable from the dev cluster's host)."""
    url = f"http://{operator_pod.status.pod_ip}:{port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _run(dc: Any, install: Any, metrics: Any, body: dict, name: str, kill_after_step: int,
         poll: float) -> dict[str, Any]:
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(dc.kubeconfig))
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)

    def status() -> dict[str, Any]:
        return custom.get_namespaced_custom_object("lifeline.dev", "v1alpha1", NAMESPACE, "trainingjobs",
                                                   name).get("status") or {}

    def job_pods() -> list[Any]:
        return [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"lifeline.dev/job={name}").items
                if p.metadata.deletion_timestamp is None]

    t = time.monotonic()
    install()
    wait_for(lambda: _ready_operator(core), 180, "the operator pod to be Ready", poll)
    startup: dict[str, float] = {"helm_install_to_operator_ready": _since(t)}

    t_apply = time.monotonic()
    dc.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(body))
    world = int(body["spec"]["replicas"])
    wait_for(lambda: len(job_pods()) == world, 120, f"{world} pods", poll)
    startup["apply_to_pods_created"] = _since(t_apply)
    wait_for(lambda: (status().get("step") or 0) >= 1, 300, "the first step", poll)
    startup["apply_to_first_step"] = _since(t_apply)

    wait_for(lambda: (status().get("completeStep") or 0) >= kill_after_step, 300,
             f"a complete checkpoint at step {kill_after_step}", poll)
    # rank 1's node, or the first rank's node that runs neither the in-cluster Redis nor MinIO (the
    # catalog dies with Redis's node and the operator then gives the job up: docs/kind.md findings)
    services = {p.spec.node_name for comp in ("redis", "minio") for p in core.list_namespaced_pod(
        NAMESPACE, label_selector=f"app.kubernetes.io/component={comp}").items}
    ranked = sorted(job_pods(), key=lambda p: (p.metadata.labels.get("lifeline.dev/rank") != "1", p.metadata.name))
    victim = next(p.spec.node_name for p in ranked if p.spec.node_name not in services)
    lost = {int(p.metadata.labels["lifeline.dev/rank"]) for p in ranked if p.spec.node_name == victim}
    step_at_kill = status().get("step")
    t_kill = time.monotonic()
    dc.kill_node(victim)
    kill: dict[str, Any] = {"victim": victim, "lost_ranks": sorted(lost), "step_at_kill": step_at_kill}
    try:
        marks = _follow_recovery(core, status, job_pods, victim, lost, world, t_kill, poll)
        kill.update(marks)
        views = {"get_tj": dc.kubectl("get", "tj", "-n", NAMESPACE),
                 "get_pods": dc.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"),
                 "describe_tj": dc.kubectl("describe", "tj", name, "-n", NAMESPACE)}
        final = wait_for(lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s, 900,
                         "the job to finish", poll)
        kill["phase"] = final["phase"]
        kill["recoveries"] = final.get("recoveries") or []
        views["get_tj_final"] = dc.kubectl("get", "tj", "-n", NAMESPACE)
        # the operator pod now serving (a new one when the killed node hosted the first)
        reconcile = _reconcile_histogram(wait_for(lambda: _ready_operator(core), 120, "a Ready operator", poll),
                                         metrics)
    finally:
        if hasattr(dc, "start_node"):
            dc.start_node(victim)
    return {"bench": "operator", "job": name, "steps": body["spec"]["steps"], "layout": body["spec"]["layout"],
            "poll_seconds": poll, "startup": startup, "node_kill": kill, "reconcile": reconcile,
            "kubectl": {k: v.rstrip("\n").splitlines() for k, v in views.items()}}


def _follow_recovery(core: Any, status: Any, job_pods: Any, victim: str, lost: set[int], world: int,
                     t_kill: float, poll: float) -> dict[str, Any]:
    """Timestamps (seconds after the kill) of each stage of the recovery, by polling."""
    marks: dict[str, Any] = {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        now = _since(t_kill)
        if "node_not_ready" not in marks and not _node_ready(core, victim):
            marks["node_not_ready"] = now
        st = status()
        if "recovering" not in marks and st.get("phase") == "Recovering":
            marks["recovering"] = now
        if "on_healthy_nodes" not in marks:
            pods = job_pods()
            if len(pods) == world and all(p.spec.node_name not in (None, victim) for p in pods):
                marks["on_healthy_nodes"] = now
        replacing = [r for r in st.get("recoveries") or [] if lost & set(r.get("ranks", []))
                     and r.get("kind") in ("ReplacePods", "Rollback", "Reshard")]
        if replacing and replacing[-1].get("seconds") is not None and (st.get("step") or 0) > (
                replacing[-1].get("fromStep") or 0):
            marks["training_resumed"] = now
            marks["resumed_recovery"] = replacing[-1]
            return marks
        time.sleep(poll)
    raise TimeoutError(f"training did not resume within 600 s of killing {victim}; seen: {marks}")


def _ready_operator(core: Any) -> Any:
    for p in core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=operator").items:
        if p.metadata.deletion_timestamp is None and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
            return p
    return None


def _node_ready(core: Any, name: str) -> bool:
    node = core.read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _reconcile_histogram(operator_pod: Any, metrics: Any) -> dict[str, Any]:
    """Scrape ``lifeline_operator_reconcile_seconds`` from the operator pod's /metrics (``metrics(pod, port)``)."""
    port = next((p.container_port for c in operator_pod.spec.containers for p in c.ports or []
                 if p.name == "metrics"), 8080)
    url = f"pod/{operator_pod.metadata.name}:{port}/metrics"
    text = metrics(operator_pod, port)
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("lifeline_operator_reconcile_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith("lifeline_operator_reconcile_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("lifeline_operator_reconcile_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])

    def quantile_bound(q: float) -> float | None:
        for le, n in sorted(buckets):
            if count and n >= q * count:
                return le
        return None

    return {"source": url, "count": int(count), "mean_seconds": round(total / count, 4) if count else None,
            "p50_at_most_seconds": quantile_bound(0.5), "p95_at_most_seconds": quantile_bound(0.95),
            "buckets": {str(le): int(n) for le, n in sorted(buckets)}}


def _since(t: float) -> float:
    return round(time.monotonic() - t, 3)


if __name__ == "__main__":  # pragma: no cover - manual runs
    print(json.dumps(run(), indent=1))
