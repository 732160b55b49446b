"""The chart on the dev cluster (a real kube-apiserver, scheduler, controllers and process nodes):
helm install with the cluster's external Redis/MinIO, the operator runs as a pod under its own
ServiceAccount, a TrainingJob gets one pod per rank with the sidecar injected and a status, and
the operator's rights stop at what the chart grants."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from lifeline.catalog import Catalog, ProgressReport

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "lifeline"
SRC = Path(__import__("lifeline").__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"
STEPS = 40  # of the real-trainer run
RELEASE = "ll"
OPERATOR_SA = "ll-lifeline-operator"

pytestmark = pytest.mark.cluster


def _wait(what: str, fn, timeout: float = 180.0, interval: float = 0.5):
    """Poll ``fn`` until it returns a truthy value; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def _get(dc, *args) -> dict:
    return json.loads(dc.kubectl("get", *args, "-o", "json"))


def _story(dc, ns: str, job: str) -> str:
    """What a failed wait shows: the job's status, its pods, and the tails of the operator's and the
    trainers' logs."""
    st = _get(dc, "trainingjob", job, "-n", ns).get("status") or {}
    out = [f"status: {st.get('phase')} {st.get('message')!r} layout={st.get('layout')} step={st.get('step')}",
           *(f"  recovery {r}" for r in st.get("recoveries", []))]
    for pod in _get(dc, "pods", "-n", ns)["items"]:
        meta = pod["metadata"]
        out.append(f"pod {meta['name']} node={pod['spec'].get('nodeName')} phase={pod['status'].get('phase')} "
                   f"gen={meta.get('labels', {}).get('lifeline.dev/generation')} deleting={bool(meta.get('deletionTimestamp'))}")
        for c, previous in ((c, p) for c in pod["spec"]["containers"] for p in (True, False)):
            try:
                path = Path(dc.log_path(meta["name"], c["name"], namespace=ns, previous=previous))
                lines = [f"{'(previous) ' if previous else ''}{line}" for line in
                         path.read_text(errors="replace").splitlines()]
            except (OSError, Exception):  # noqa: BLE001 - diagnostics only (no previous run, no log)
                continue
            errors = [line for line in lines[:-8] if "error" in line.lower() or "Traceback" in line][-10:]
            out += [f"    {c['name']}: {line[:400]}" for line in errors + lines[-8:]]
    return "\n".join(out)


@pytest.fixture
def operator_release(devcluster, namespace):
    """The chart installed into ``namespace`` (watching it), Redis/MinIO from the dev cluster."""
    from minio import Minio

    s3 = Minio(devcluster.minio_endpoint, devcluster.minio_access_key, devcluster.minio_secret_key, secure=False)
    if not s3.bucket_exists("lifeline"):
        s3.make_bucket("lifeline")
    crd_exists = devcluster.kubectl("get", "crd", "trainingjobs.lifeline.dev", "--ignore-not-found", "-o", "name")
    devcluster.helm(
        "install", RELEASE, str(CHART), "--namespace", namespace,
        "--set", f"crds.enabled={'false' if crd_exists.strip() else 'true'}",
        "--set", f"redis.external.url={devcluster.redis_url}",
        "--set", f"objectStorage.external.endpoint={devcluster.minio_endpoint}",
        "--set", f"objectStorage.accessKey={devcluster.minio_access_key}",
        "--set", f"objectStorage.secretKey={devcluster.minio_secret_key}",
        "--set", "operator.resyncSeconds=2",
        "--set", "operator.metricsService.enabled=false",  # Endpoints refuse the dev cluster's loopback pod IPs
        # process pods run this interpreter without the test's PYTHONPATH: point the operator at the
        # code under test (a worktree's src), not whatever the venv's editable install names
        "--set", "operator.extraEnv[0].name=PYTHONPATH", "--set", f"operator.extraEnv[0].value={SRC}",
    )
    devcluster.kubectl("wait", "--for=condition=Established", "crd/trainingjobs.lifeline.dev", "--timeout=60s")

    def operator_ready():
        pods = _get(devcluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/component=operator")["items"]
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for p in pods for c in p.get("status", {}).get("conditions", []))

    _wait("the operator pod to be Ready", operator_ready, timeout=120)
    try:
        yield namespace
    finally:
        devcluster.kubectl("delete", "trainingjobs", "--all", "-n", namespace, "--wait=false", check=False)
        devcluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)


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


def _reference_digest(body: dict, tmp_path: Path) -> str:
    """Digest of the final state of ``lifeline run`` of the same spec without failures (local
    processes, their own Redis, L2 on the filesystem)."""
    import subprocess
    import sys

    job = tmp_path / "reference.yaml"
    job.write_text(yaml.safe_dump(body))
    p = subprocess.run(
        [sys.executable, "-m", "lifeline", "run", str(job), "--json", "--state-dir", str(tmp_path / "reference"),
         "--persist-uri", str(tmp_path / "reference-l2"), "--timeout", "600"],
        capture_output=True, text=True, cwd=ROOT, timeout=660)
    assert p.returncode == 0, f"the failure-free reference run failed:\n{p.stderr[-3000:]}"
    digest = json.loads(p.stdout.strip().splitlines()[-1])["digest"]
    assert (digest["source"], digest["step"]) == ("L2", STEPS), digest
    return digest["sha256"]


def _l2(devcluster):
    """``(storage, prefix)`` of the example's L2 URI in the cluster's MinIO."""
    from lifeline.checkpoint import StorageOptions, storage_from_uri

    uri = yaml.safe_load(EXAMPLE.read_text())["spec"]["checkpoint"]["persist"]["uri"]
    return storage_from_uri(uri, StorageOptions(endpoint=devcluster.minio_endpoint,
                                                access_key=devcluster.minio_access_key,
                                                secret_key=devcluster.minio_secret_key))


def _forget_l2(devcluster, job: str) -> None:
    storage, prefix = _l2(devcluster)
    for key in storage.list(f"{prefix.strip('/')}/{job}/"):
        storage.delete(key)


def _l2_digest(devcluster, job: str, step: int) -> str:
    """SHA-256 of the consolidated state of ``job``'s checkpoint ``step`` in the cluster's MinIO."""
    from lifeline.checkpoint import consolidate
    from lifeline.launch.summary import await_l2_step, state_digest

    storage, prefix = _l2(devcluster)
    assert await_l2_step(storage, prefix, job, step, 120.0), f"step {step} of {job} never reached L2"
    return state_digest(consolidate(storage, prefix, job, step))


@pytest.mark.slow
def test_elastic_job_shrinks_from_memory_when_a_lost_node_leaves_no_room_and_grows_back(devcluster,
                                                                                       operator_release):
    """3 ranks (data parallel 3), each pod requesting 3 of a node's 4 CPUs: one per node. Kill the
    node of rank 1: the two healthy nodes have room for two pods only, so the operator (node
    capacity from requests) reshards to data 2, keeping rank 0's pod, recreating rank 1's on rank 2's
    node and deleting rank 2's to make room. Start the node again:
    once its cool-down is over the operator grows the job back to data 3, again from memory, and
    the job finishes at the spec's size; each change is a status record and an event."""
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = "elastic"
    spec = body["spec"]
    steps = 1500  # data parallel only, ~20 steps/s: room for the kill, the shrink, the node's return and the grow
    spec.update(replicas=3, layout={"tensor": 1, "pipeline": 1, "data": 3, "expert": 1}, steps=steps)
    spec["recovery"]["hangTimeoutSeconds"] = 120
    spec["recovery"]["nodeCooldownSeconds"] = 5
    spec["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}
    _forget_l2(devcluster, "elastic")
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def status() -> dict:
        return _get(devcluster, "trainingjob", "elastic", "-n", ns).get("status") or {}

    def history(st: dict) -> list:
        return [(r["generation"], r["kind"], r["ranks"], r.get("fromStep"), r.get("tier")) for r in st.get("recoveries", [])]

    _wait("a complete checkpoint at step >= 12", lambda: (status().get("completeStep") or 0) >= 12, timeout=300)
    keeper = _get(devcluster, "pod", "elastic-0", "-n", ns)["metadata"]["uid"]
    victim = _get(devcluster, "pod", "elastic-1", "-n", ns)["spec"]["nodeName"]
    devcluster.kill_node(victim)
    try:
        try:
            shrunk = _wait("the job to run in data 2", lambda: (s := status()).get("phase") == "Running" and
                           (s.get("layout") or {}).get("data") == 2 and s, timeout=600)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{_story(devcluster, ns, 'elastic')}") from None
        # one pod fits a node: rank 1's new pod needs rank 2's node, so rank 2's pod (and the replica
        # of rank 1 its sidecar held) goes at once; what memory still holds is read from it, the rest from L2
        assert shrunk["recoveries"][-1]["kind"] == "Reshard", history(shrunk)
        assert _get(devcluster, "pod", "elastic-0", "-n", ns)["metadata"]["uid"] == keeper  # rank 0's pod stayed
    finally:
        devcluster.start_node(victim)
        devcluster.wait_nodes_ready(timeout=120)
    st = _wait("the job to finish", lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s,
               timeout=900)
    assert st["phase"] == "Succeeded", _story(devcluster, ns, "elastic")
    reshards = [r for r in st["recoveries"] if r["kind"] == "Reshard"]
    assert [r["layout"]["data"] for r in reshards] == [2, 3], history(st)
    assert reshards[0]["ranks"] == [1] and reshards[1]["ranks"] == []  # the grow answers no failure
    assert reshards[1]["tier"] in ("L0", "L1"), history(st)
    assert st["layout"]["data"] == 3 and st["replicas"] == 3 and st["step"] == steps
    reasons = [e["reason"] for e in _get(devcluster, "events", "-n", ns,
                                        "--field-selector", "involvedObject.name=elastic")["items"]]
    assert reasons.count("Reshard") == 2, reasons
    pods = _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=elastic")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert sorted(p["metadata"]["labels"]["lifeline.dev/rank"] for p in live) == ["0", "1", "2"]
    assert next(p for p in live if p["metadata"]["labels"]["lifeline.dev/rank"] == "0")["metadata"]["uid"] == keeper
    # the arenas live in the pods' own volumes, not in the host's /dev/shm, where a deleted
    # pod's slots would stay behind (768 MiB for rank 2 here)
    # (`lifeline-<job>-<rank>`: a `lifeline run` of a job of that name elsewhere in the suite has its own)
    assert not [p for p in Path("/dev/shm").glob("lifeline-elastic-*") if re.fullmatch(r"lifeline-elastic-\d+", p.name)]


@pytest.mark.slow
def test_a_trainer_crash_in_one_stage_is_replayed_locally_from_its_sparse_window(devcluster, operator_release, tmp_path):
    """The operator takes the LocalizedReplay rung (the engine both runners share): with sparse
    checkpoints (W = 3) and no dense checkpoint before the end, a trainer killed in one pipeline
    stage makes that stage's ranks restore their latest complete window from their sidecars and
    replay it from the other stage's upstream logs while the other stage keeps its state; the job
    ends bit-identical to a failure-free run, and ``kubectl get tj`` shows the rung. (A node of
    the dev cluster holds ranks of both stages, so a node loss takes the global rung from the
    window instead: tests/launch/test_localized_replay.py covers node loss of one stage.)"""
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = "gpt-moe-sparse"
    body["spec"]["steps"] = STEPS
    body["spec"]["checkpoint"]["every"] = body["spec"]["checkpoint"]["persist"]["every"] = STEPS
    body["spec"]["checkpoint"]["sparse"] = {"window": 3}
    body["spec"]["recovery"].pop("elastic")
    body["spec"]["recovery"]["localizedReplay"] = True
    body["spec"]["recovery"]["hangTimeoutSeconds"] = 120
    _forget_l2(devcluster, "gpt-moe-sparse")
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def progressed():
        st = _get(devcluster, "trainingjob", "gpt-moe-sparse", "-n", ns).get("status") or {}
        return st if st.get("phase") == "Running" and (st.get("step") or 0) >= 8 else None

    _wait("training to pass step 8 (two sparse windows)", progressed, timeout=300)
    devcluster.kill_container("gpt-moe-sparse-1", "trainer", namespace=ns)

    def finished():
        st = _get(devcluster, "trainingjob", "gpt-moe-sparse", "-n", ns).get("status") or {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = _wait("the job to finish", finished, timeout=900)
    history = [(r["kind"], r["ranks"], r.get("fromStep"), r.get("reason", "")[:200]) for r in st.get("recoveries", [])]
    assert st["phase"] == "Succeeded", f"{st.get('message')}; recoveries: {history}"
    first = st["recoveries"][0]
    assert first["kind"] == "LocalizedReplay" and "sparse window" in first["reason"], history
    assert first["ranks"] == [1] and "ranks [0, 1] restore" in first["reason"], history
    assert first["fromStep"] % 3 == 0
    row = devcluster.kubectl("get", "tj", "gpt-moe-sparse", "-n", ns, "--no-headers").split()
    assert st["recoveries"][-1]["kind"] in row
    got = _l2_digest(devcluster, "gpt-moe-sparse", STEPS)
    assert got == _reference_digest(body, tmp_path), "final parameters differ from the failure-free run's"
