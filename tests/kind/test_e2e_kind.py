"""Lifeline on kind: real kubelets, containerd, CNI, CoreDNS and kube-proxy, images built here.

The chart is installed with its in-cluster Redis and MinIO (reached by Service name), the
example TrainingJob runs with the pod spec the operator builds (Memory emptyDir at /dev/shm,
probes, restartPolicy, security contexts) unchanged, and real faults are injected: a trainer
process SIGKILLed inside its container, a pod deleted, a worker node's container killed
(``docker kill``) with the operator killed while it recovers. Every run must end bit-identical
to a failure-free ``lifeline run`` of the same spec in the same image (invariant 1). RBAC is checked against
kind's apiserver with the chart's ServiceAccounts, including the operator's own token.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from lifeline._poll import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"
STEPS = 40  # the trainer-kill run (~9 steps/s on kind here)
NODE_KILL_STEPS = 400  # long enough that a trainer or node killed after step 3 dies mid-run
JOB = "gpt-moe"
OPERATOR_SA = "ll-lifeline-operator"
WORKLOAD_SA = "ll-lifeline-workload"

pytestmark = pytest.mark.kind


def _status(c, ns: str, job: str = JOB) -> dict:
    return c.get("trainingjob", job, "-n", ns).get("status") or {}


def _ready(pod: dict) -> bool:
    return any(x["type"] == "Ready" and x["status"] == "True" for x in pod.get("status", {}).get("conditions", []))


def _spec(steps: int = STEPS) -> dict:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["steps"] = steps
    body["spec"]["recovery"]["hangTimeoutSeconds"] = 120
    return body


def _reference_run(tmp: Path, steps: int) -> str:
    """The digest of a failure-free ``lifeline run`` of ``_spec(steps)`` in the Lifeline image
    (``docker run``, no network; the final state read back from L2 at ``steps``)."""
    from lifeline.kindbed.engine import docker
    from lifeline.kindbed.images import LIFELINE_IMAGE

    tmp.chmod(0o777)
    (tmp / "job.yaml").write_text(yaml.safe_dump(_spec(steps)))
    p = docker("run", "--rm", "--network", "none", "--shm-size", "4g", "-v", f"{tmp}:/ref", "-w", "/tmp",
               LIFELINE_IMAGE, "run", "/ref/job.yaml", "--json", "--state-dir", "/tmp/state",
               "--persist-uri", "/tmp/l2", "--timeout", "1200", timeout=1500)
    got = json.loads(p.stdout.strip().splitlines()[-1])["digest"]
    assert (got["source"], got["step"]) == ("L2", steps), got
    return got["sha256"]


@pytest.fixture(scope="module", autouse=True)
def _reference_started(tmp_path_factory):
    """The failure-free reference run of :data:`NODE_KILL_STEPS` started in the Lifeline image (built
    from this checkout first) before the cluster comes up, on a thread: it runs while kind creates
    the nodes and the images load, instead of after the first fault test (issue 23). Autouse, so
    pytest sets it up before the module's other fixtures."""
    from lifeline.kindbed import engine, images

    engine.ensure_engine()
    images.ensure_lifeline(ROOT)
    pool = ThreadPoolExecutor(1, thread_name_prefix="kind-reference")
    future = pool.submit(_reference_run, tmp_path_factory.mktemp("reference"), NODE_KILL_STEPS)
    try:
        yield {NODE_KILL_STEPS: future}
    finally:
        pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def reference_digest(_reference_started, kind_cluster, tmp_path_factory):
    """``digest(steps)``: the final state's digest of a failure-free ``lifeline run`` of ``_spec(steps)``
    in the Lifeline image the pods run: the same code, interpreter and libraries. (The test venv's
    interpreter and the image's differ, and so do their digests: see docs/kind.md "Measured".)
    :data:`NODE_KILL_STEPS` comes from the run started with the module; other step counts run here."""
    runs = dict(_reference_started)

    def digest(steps: int) -> str:
        if steps not in runs:
            return runs.setdefault(steps, _reference_run(tmp_path_factory.mktemp("reference"), steps))
        got = runs[steps]
        return got.result(timeout=1500) if isinstance(got, Future) else got

    return digest


@contextlib.contextmanager
def _minio(c, ns: str):
    """``(storage, prefix)`` of the example's L2 URI in the in-cluster MinIO (through a port-forward)."""
    import base64

    from lifeline.checkpoint import StorageOptions, storage_from_uri

    data = c.get("secret", "ll-lifeline-object-storage", "-n", ns)["data"]
    key, secret = (base64.b64decode(data[k]).decode() for k in ("access-key", "secret-key"))
    uri = yaml.safe_load(EXAMPLE.read_text())["spec"]["checkpoint"]["persist"]["uri"]
    with c.port_forward(ns, "svc/ll-lifeline-minio", 9000) as port:
        yield storage_from_uri(uri, StorageOptions(endpoint=f"127.0.0.1:{port}", access_key=key, secret_key=secret))


def _l2_digest(c, ns: str, job: str, step: int) -> str:
    """SHA-256 of the consolidated state of ``job``'s L2 checkpoint ``step`` in the in-cluster MinIO."""
    from lifeline.checkpoint import consolidate
    from lifeline.launch.summary import await_l2_step, state_digest

    with _minio(c, ns) as (storage, prefix):
        assert await_l2_step(storage, prefix, job, step, 120.0), f"step {step} of {job} never reached L2"
        return state_digest(consolidate(storage, prefix, job, step))


def _run_job(c, ns: str, body: dict) -> None:
    """Apply ``body`` as a new job: the previous job of its name deleted with its pods and its L2
    checkpoints (a job applied again resumes from the latest one, in any layout)."""
    name = body["metadata"]["name"]
    c.kubectl("delete", "trainingjob", name, "-n", ns, "--ignore-not-found", "--wait=true", timeout=180)
    wait_for(lambda: not c.get("pods", "-n", ns, "-l", f"lifeline.dev/job={name}")["items"],
             180, "the previous job's pods to be gone", 1.0)
    with _minio(c, ns) as (storage, prefix):
        for key in storage.list(f"{prefix.strip('/')}/{name}/"):
            storage.delete(key)
    c.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))


def _finished(c, ns: str, steps: int = STEPS, timeout: float = 900) -> dict:
    st = wait_for(lambda: (s := _status(c, ns)).get("phase") in ("Succeeded", "Failed") and s, timeout,
                  "the job to finish", 2.0)
    history = [(r["generation"], r["kind"], r["ranks"], r.get("fromStep")) for r in st.get("recoveries", [])]
    assert st["phase"] == "Succeeded", f"{st.get('message')}; recoveries: {history}"
    assert st["step"] == steps
    return st


def _victim(c, ns: str) -> str:
    """The node to kill: one running a rank but not the in-cluster Redis or MinIO (rank 1's when it
    qualifies). The chart's Redis keeps the catalog in memory only: killing its node loses every
    job's holdings, and the operator then gives up the job (measured; docs/kind.md)."""
    services = {p["spec"]["nodeName"] for comp in ("redis", "minio")
                for p in c.get("pods", "-n", ns, "-l", f"app.kubernetes.io/component={comp}")["items"]}
    ranks = sorted(c.get("pods", "-n", ns, "-l", f"lifeline.dev/job={JOB}")["items"],
                   key=lambda p: (p["metadata"]["labels"]["lifeline.dev/rank"] != "1", p["metadata"]["name"]))
    victims = [p["spec"]["nodeName"] for p in ranks if p["spec"]["nodeName"] not in services]
    assert victims, f"every rank shares a node with Redis or MinIO ({services}); nothing to kill but them"
    return victims[0]


def _story(c, ns: str) -> str:
    """What an operator engineer would look at: kubectl get tj, describe, the job's events."""
    return "\n".join([c.kubectl("get", "tj", "-n", ns, "-o", "wide"), c.kubectl("describe", "tj", JOB, "-n", ns),
                      c.kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={JOB}",
                                "--sort-by=.lastTimestamp")])


def test_chart_runs_on_real_nodes(kind_release):
    """Four Ready nodes running kubelet v1.32.13 over containerd; the operator, Redis and MinIO run as
    real containers on workers; the fixture reached MinIO by its Service name from a pod."""
    c, ns = kind_release
    nodes = c.get("nodes")["items"]
    assert len(nodes) == 4
    for n in nodes:
        info = n["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.32.13" and info["containerRuntimeVersion"].startswith("containerd://")
        assert any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"]["conditions"])
    workers = set(c.workers())
    for component in ("operator", "redis", "minio"):
        (pod,) = c.get("pods", "-n", ns, "-l", f"app.kubernetes.io/component={component}")["items"]
        assert _ready(pod) and pod["spec"]["nodeName"] in workers
        assert all(s["containerID"].startswith("containerd://") for s in pod["status"]["containerStatuses"])
    svc = c.get("service", "ll-lifeline-redis", "-n", ns)
    assert svc["spec"]["clusterIP"] not in ("", "None")
    dns = c.get("deployment", "coredns", "-n", "kube-system")
    assert dns["status"].get("readyReplicas") == dns["spec"]["replicas"]


def test_rbac_denials_on_the_real_apiserver(kind_release):
    """The chart's ServiceAccounts, judged by kind's apiserver: SubjectAccessReview, impersonated
    requests, and the operator pod's own mounted token from inside its container."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    c, ns = kind_release
    authz = client.AuthorizationV1Api(c.api_client())

    def can(sa: str, verb: str, resource: str, namespace: str | None = ns, group: str = "", sub: str | None = None):
        spec = client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{ns}:{sa}", groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
            resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace,
                                                            group=group, subresource=sub))
        return authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec)).status.allowed

    assert can(OPERATOR_SA, "create", "pods") and can(OPERATOR_SA, "get", "secrets")
    assert can(OPERATOR_SA, "patch", "trainingjobs", group="lifeline.dev", sub="status")
    assert can(OPERATOR_SA, "list", "nodes", None)
    assert not can(OPERATOR_SA, "list", "pods", None) and not can(OPERATOR_SA, "get", "secrets", "kube-system")
    assert not can(OPERATOR_SA, "update", "secrets") and not can(OPERATOR_SA, "delete", "nodes", None)
    assert can(WORKLOAD_SA, "get", "trainingjobs", group="lifeline.dev")
    assert not can(WORKLOAD_SA, "list", "pods") and not can(WORKLOAD_SA, "get", "secrets")
    api = c.api_client()
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:{OPERATOR_SA}")
    client.CoreV1Api(api).list_namespaced_pod(ns)
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api).read_namespaced_secret("kubeadm-certs", "kube-system")
    assert err.value.status == 403
    # the operator's own token, from inside its container (in-cluster config: the kubernetes Service)
    probe = ("from kubernetes import client, config\nconfig.load_incluster_config()\nv = client.CoreV1Api()\n"
             f"print('own', len(v.list_namespaced_pod('{ns}').items) > 0)\n"
             "for call in (v.list_pod_for_all_namespaces, lambda: v.list_namespaced_secret('kube-system')):\n"
             "    try:\n        call(); print('allowed')\n"
             "    except client.ApiException as e:\n        print('denied', e.status)\n")
    out = c.kubectl("exec", "-n", ns, f"deploy/{OPERATOR_SA}", "-c", "operator", "--", "python", "-c", probe)
    assert out.split("\n")[:3] == ["own True", "denied 403", "denied 403"], out


@pytest.mark.slow
def test_trainer_sigkill_and_pod_deletion_end_bit_identical(kind_release, reference_digest):
    """SIGKILL of rank 2's trainer process inside its container (the kubelet restarts the container,
    L0 restore), then deletion of rank 3's pod (the operator replaces it): the job succeeds with the
    failure-free run's final parameters."""
    c, ns = kind_release
    _run_job(c, ns, _spec(NODE_KILL_STEPS))  # 40 steps can end before the kill lands (seen in CI)
    wait_for(lambda: (_status(c, ns).get("completeStep") or 0) >= 3, 600, "a complete checkpoint at step >= 3", 2.0)
    pid = c.kill_container_process(f"{JOB}-2", "trainer", ns)
    assert pid > 1

    def restarted():
        pod = c.get("pod", f"{JOB}-2", "-n", ns)
        return any(s["name"] == "trainer" and s["restartCount"] >= 1 for s in pod["status"]["containerStatuses"])

    wait_for(restarted, 180, "the trainer container of rank 2 to restart", 1.0)
    # the second failure comes after the first recovery resumed training: deleting rank 3's pod while
    # rank 2's restart is still being planned makes one ReplacePods [2, 3] of the two (a CI run)
    wait_for(lambda: (r := _status(c, ns).get("recoveries") or []) and r[0].get("resumedAt"), 300,
             "the recovery of rank 2's restart to resume training", 1.0)
    old = c.get("pod", f"{JOB}-3", "-n", ns)["metadata"]["uid"]
    c.kubectl("delete", "pod", f"{JOB}-3", "-n", ns, "--wait=false")
    st = _finished(c, ns, NODE_KILL_STEPS)
    assert st["restarts"] >= 1, st.get("recoveries")
    assert c.get("pod", f"{JOB}-3", "-n", ns)["metadata"]["uid"] != old
    assert _l2_digest(c, ns, JOB, NODE_KILL_STEPS) == reference_digest(NODE_KILL_STEPS)


@pytest.mark.slow
def test_node_container_killed_mid_run_and_operator_killed_mid_recovery(kind_release, reference_digest):
    """``docker kill`` of a worker running a rank (not Redis or MinIO): the node goes NotReady, the operator plans the
    recovery, is itself killed (force-deleted) once the plan is committed, and its replacement
    finishes it; the lost ranks run on the other nodes and the job ends bit-identical."""
    c, ns = kind_release
    _run_job(c, ns, _spec(NODE_KILL_STEPS))
    wait_for(lambda: _status(c, ns).get("phase") == "Running" and (_status(c, ns).get("completeStep") or 0) >= 3,
             600, "training to reach a complete checkpoint at step >= 3", 2.0)
    victim = _victim(c, ns)
    c.kill_node(victim)
    wait_for(lambda: any(x["type"] == "Ready" and x["status"] != "True"
                         for x in c.get("node", victim)["status"]["conditions"]), 120, f"{victim} NotReady", 1.0)
    wait_for(lambda: _status(c, ns).get("recoveries"), 180, f"a recovery after killing {victim}", 1.0)
    old = {p["metadata"]["name"] for p in c.get("pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]}
    c.kubectl("delete", "pod", "-n", ns, "-l", "app.kubernetes.io/component=operator", "--wait=false",
              "--grace-period=0", "--force")
    wait_for(lambda: [p for p in c.get("pods", "-n", ns, "-l", "app.kubernetes.io/component=operator")["items"]
                      if p["metadata"]["name"] not in old and _ready(p)], 180, "a new operator pod Ready", 1.0)

    def moved():
        pods = [p for p in c.get("pods", "-n", ns, "-l", f"lifeline.dev/job={JOB}")["items"]
                if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == 4 and all(p["spec"].get("nodeName") not in (None, victim) for p in pods) and pods

    for pod in wait_for(moved, 300, "every rank on a healthy node", 1.0):
        if pod["metadata"]["labels"]["lifeline.dev/generation"] != "0":
            assert victim in json.dumps(pod["spec"].get("affinity", {}))  # the lost node is in cool-down
    st = _finished(c, ns, NODE_KILL_STEPS)
    assert any(r["kind"] in ("ReplacePods", "Rollback", "Reshard") for r in st["recoveries"]), st["recoveries"]
    reasons = {e["reason"] for e in c.get("events", "-n", ns, "--field-selector", f"involvedObject.name={JOB}")["items"]}
    assert {"FailureDetected", "Recovered", "Succeeded"} <= reasons
    print(_story(c, ns))
    assert _l2_digest(c, ns, JOB, NODE_KILL_STEPS) == reference_digest(NODE_KILL_STEPS)
