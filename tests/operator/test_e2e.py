"""The chart on the dev cluster (a real kube-apiserver, scheduler, controllers and process nodes):
helm install with the cluster's external Redis/MinIO, the operator runs as a pod under its own
ServiceAccount, a TrainingJob gets one pod per rank with the sidecar injected and a status, and
the operator's rights stop at what the chart grants. Recoveries that need a reference run:
test_e2e_recovery.py."""

from __future__ import annotations

import re
import time

import pytest
import yaml

from lifeline.catalog import Catalog, ProgressReport

from _e2e import EXAMPLE, OPERATOR_SA, _get, _wait

pytestmark = pytest.mark.cluster


def test_trainingjob_gets_pods_with_sidecar_and_status(devcluster, operator_release):
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def all_pods():
        items = _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=gpt-moe")["items"]
        return items if len(items) == 4 else None

    pods = sorted(_wait("4 rank pods", all_pods, timeout=120), key=lambda p: int(p["metadata"]["labels"]["lifeline.dev/rank"]))
    job = _get(devcluster, "trainingjob", "gpt-moe", "-n", ns)
    assert [p["metadata"]["name"] for p in pods] == [f"gpt-moe-{r}" for r in range(4)]
    for r, pod in enumerate(pods):
        assert [c["name"] for c in pod["spec"]["containers"]] == ["trainer", "sidecar"]
        assert pod["metadata"]["labels"]["lifeline.dev/generation"] == "0"
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert pod["spec"]["serviceAccountName"] == "ll-lifeline-workload"
        env = {e["name"]: e for e in pod["spec"]["containers"][1]["env"]}
        assert env["LIFELINE_RANK"]["value"] == str(r)
        assert env["LIFELINE_REDIS_URL"]["value"] == devcluster.redis_url
    secret = _get(devcluster, "secret", "gpt-moe-lifeline", "-n", ns)
    assert len(secret["data"]["hmac-key"]) > 40  # base64 of 64 hex characters

    def status():
        st = _get(devcluster, "trainingjob", "gpt-moe", "-n", ns).get("status") or {}
        return st if st.get("phase") and st.get("conditions") else None

    st = _wait("a status with phase and conditions", status, timeout=60)
    assert st["phase"] in ("Pending", "Running", "Recovering", "Succeeded")
    assert {c["type"] for c in st["conditions"]} == {"Ready", "Progressing", "Recovering", "Degraded"}
    assert all(c["observedGeneration"] == job["metadata"]["generation"] for c in st["conditions"])
    events = _get(devcluster, "events", "-n", ns, "--field-selector", "involvedObject.name=gpt-moe")["items"]
    assert {"SecretCreated", "PodCreated"} <= {e["reason"] for e in events}

    # deleting the job garbage-collects its pods and Secret (ownerReferences)
    # (well under kopf's default 60 s re-check of a resync timer caught mid-run by the deletion)
    devcluster.kubectl("delete", "trainingjob", "gpt-moe", "-n", ns, "--wait=true", "--timeout=30s", timeout=90)
    _wait("the job's pods to be garbage-collected",
          lambda: not _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=gpt-moe")["items"], timeout=120)


def test_operator_rights_stop_at_the_chart(devcluster, operator_release):
    ns = operator_release
    other = f"{ns}-other"
    devcluster.create_namespace(other)
    try:
        who = f"system:serviceaccount:{ns}:{OPERATOR_SA}"

        def can(*args: str) -> bool:
            out = devcluster.kubectl("auth", "can-i", *args, "--as", who, check=False).strip()
            return out == "yes"

        assert can("create", "secrets", "-n", ns)
        assert can("create", "pods", "-n", ns)
        assert can("list", "nodes")
        assert can("patch", "trainingjobs.lifeline.dev/status", "-n", ns)
        assert not can("get", "secrets", "-n", other)
        assert not can("create", "pods", "-n", other)
        # node capacity counts the watched namespaces' pods: no pod list elsewhere unless opted in
        assert not can("list", "pods", "-n", other) and not can("list", "pods", "--all-namespaces")
        assert not can("get", "pods", "-n", other) and not can("watch", "pods", "-n", other)
        assert not can("delete", "nodes")
        assert not can("update", "secrets", "-n", ns)
        assert not can("get", "secrets", "-n", "kube-system")
        # the API server refuses the operator's identity a Secret in another namespace (403), not a 404
        from kubernetes import client

        devcluster.kubectl("create", "secret", "generic", "probe", "-n", other, "--from-literal=k=v")
        api = devcluster.api_client()
        api.set_default_header("Impersonate-User", who)
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(api).read_namespaced_secret("probe", other)
        assert denied.value.status == 403
    finally:
        devcluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def _catalog_as_trainers_report(redis_url: str, job: str, *, generation: int, step: int, placement: dict) -> None:
    """Write what the runtime and the sidecars publish (progress per rank; L0 and one L1 holding
    per shard on another node) for a job whose trainer does not checkpoint (a sleeping process)."""
    ranks = sorted(placement)
    catalog = Catalog(redis_url, job, len(ranks))
    try:
        for rank in ranks:
            peer = next(p for p in ranks[rank + 1:] + ranks[:rank] if placement[p] != placement[rank])
            catalog.add_holding(step, rank, "L0", rank)
            catalog.add_holding(step, rank, "L1", peer)
            catalog.report(ProgressReport("step", job, rank, generation, time.time(), step))
        for rank in ranks:  # every rank speaks before a new job's first complete step is set
            latest = catalog.try_advance(step, "L1", rank=rank)
        assert latest == step
    finally:
        catalog.close()


def test_lost_node_pods_replaced_elsewhere(devcluster, operator_release):
    """The operator's half of a node failure, with a trainer that only sleeps: the catalog records
    the trainers and sidecars would publish are written by the test. The node of rank 2 is killed;
    the operator commits a ReplacePods plan (annotations, then the catalog), replaces the pod on a
    healthy node with the dead node in its NotIn affinity, and closes the recovery once every rank
    reports a step in the new generation. The operator is itself restarted mid-way and acts once."""
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = "sleepy"
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", "import time; time.sleep(1e6)"]
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def placed():
        items = _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=sleepy")["items"]
        ok = len(items) == 4 and all(p["spec"].get("nodeName") for p in items)
        return {int(p["metadata"]["labels"]["lifeline.dev/rank"]): p["spec"]["nodeName"] for p in items} if ok else None

    placement = _wait("4 scheduled pods", placed, timeout=120)
    _wait("the operator to own the job's catalog keys", lambda: __import__("redis").Redis.from_url(
        devcluster.redis_url).get("lifeline:sleepy:owner"), timeout=60)
    # after every sidecar registered: a sidecar's first registration drops holdings recorded for it
    # that it does not hold (an earlier incarnation's), which these written ones would be
    _wait("every sidecar registered", lambda: all(Catalog(devcluster.redis_url, "sleepy", 4).is_registered(r)
                                                  for r in range(4)), timeout=120)
    _catalog_as_trainers_report(devcluster.redis_url, "sleepy", generation=0, step=5, placement=placement)
    _wait("phase Running", lambda: (_get(devcluster, "trainingjob", "sleepy", "-n", ns).get("status") or {})
          .get("phase") == "Running", timeout=60)
    victim = placement[2]
    devcluster.kill_node(victim)
    try:
        def planned():
            st = _get(devcluster, "trainingjob", "sleepy", "-n", ns).get("status") or {}
            return st if st.get("generation") == 1 else None

        st = _wait(f"a recovery plan after killing {victim}", planned, timeout=120)
        assert st["phase"] == "Recovering" and st["restarts"] == 1
        (rec,) = st["recoveries"]
        assert (rec["kind"], rec["fromStep"], rec["tier"]) == ("ReplacePods", 5, "L1")
        assert 2 in rec["ranks"]
        # the operator that committed the plan counted it (its own /metrics, scraped from its pod)
        text = _wait("the operator's /metrics", lambda: _operator_metrics(devcluster, ns), timeout=30)
        assert 'lifeline_operator_failures_total{job="sleepy",kind="NODE_LOST",namespace="%s"} 1.0' % ns in text, \
            [x for x in text.splitlines() if "failures_total" in x]
        assert 'lifeline_operator_recoveries_total{action="ReplacePods",job="sleepy",namespace="%s"} 1.0' % ns \
            in text, [x for x in text.splitlines() if "recoveries_total" in x]
        devcluster.kubectl("delete", "pod", "-n", ns, "-l", "app.kubernetes.io/component=operator", "--wait=false")

        def replaced():
            pods = _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=sleepy")["items"]
            new = [p for p in pods if p["metadata"]["labels"]["lifeline.dev/generation"] == "1"
                   and p["spec"].get("nodeName")]
            return new if len(new) == len(rec["ranks"]) else None

        for pod in _wait("the lost ranks' pods on healthy nodes", replaced, timeout=120):
            assert pod["spec"]["nodeName"] != victim
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [victim]} in \
                terms["nodeSelectorTerms"][0]["matchExpressions"]
        plan = Catalog(devcluster.redis_url, "sleepy", 4).plan(1)
        assert (plan.generation, plan.restore_step, plan.action.value) == (1, 5, "ReplacePods")
        survivors = {r: n for r, n in placement.items() if n != victim}
        _catalog_as_trainers_report(devcluster.redis_url, "sleepy", generation=1, step=6,
                                    placement={**survivors, **{r: "elsewhere" for r in rec["ranks"]}})

        def resumed():
            st = _get(devcluster, "trainingjob", "sleepy", "-n", ns).get("status") or {}
            return st if st.get("phase") == "Running" and st["recoveries"][0].get("seconds") is not None else None

        st = _wait("the recovery to close", resumed, timeout=60)
        assert st["generation"] == 1 and st["restarts"] == 1 and len(st["recoveries"]) == 1  # acted once
        reasons = [e["reason"] for e in _get(devcluster, "events", "-n", ns,
                                             "--field-selector", "involvedObject.name=sleepy")["items"]]
        assert reasons.count("ReplacePods") == 1 and "Recovered" in reasons
        # the operator that closed the recovery timed it, and reconciles are timed and counted
        def timed() -> str | None:
            text = _operator_metrics(devcluster, ns)
            return text if 'recovery_seconds_count{action="ReplacePods"} 1.0' in text else None

        text = _wait("the new operator's metrics of the closed recovery", timed, timeout=30)
        assert 'lifeline_operator_checkpoint_lag_steps{job="sleepy",namespace="%s"}' % ns in text
        assert re.search(r"lifeline_operator_reconcile_seconds_count [1-9]", text), text[-2000:]
    finally:
        devcluster.start_node(victim)
        devcluster.wait_nodes_ready(timeout=120)


def _operator_metrics(devcluster, ns: str) -> str:
    """The Prometheus text of the running, Ready operator pod's ``/metrics`` (its pod IP, port 8080)."""
    import httpx

    pods = [p for p in _get(devcluster, "pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]
            if not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("podIP") and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
    if not pods:
        return ""
    try:
        return httpx.get(f"http://{pods[0]['status']['podIP']}:8080/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""
