"""Least privilege checked by the real kube-apiserver of the dev cluster (docs/security.md).

The chart is rendered by the real helm and its RBAC, ServiceAccounts, Secrets and NetworkPolicies
are applied; the apiserver then answers, for the chart's own ServiceAccounts (SubjectAccessReview,
and real requests impersonating them), what each may do. The operator's pods, the chart's pods and
the per-job NetworkPolicy are created (server-side dry-run for pods: admission runs, nothing is
scheduled) in a namespace labelled ``pod-security.kubernetes.io/enforce=restricted``, so the
apiserver's PodSecurity admission judges every security context.
"""

from __future__ import annotations

import base64
import copy
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lifeline.api.load import load_trainingjob
from lifeline.api.disruption import disruption_budget_name
from lifeline.api.manifests import PodConfig, rank_pod, secret_name
from lifeline.api.netpol import network_policy_name
from lifeline.catalog import Catalog
from lifeline.devcluster.services import RedisServer
from lifeline.operator.access import ensure_disruption_budget, ensure_network_policy, ensure_redis_user, ensure_secret
from lifeline.operator.reconcile import Env
from lifeline.operator.settings import OperatorSettings

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "lifeline"
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"
APPLIED = {"ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "NetworkPolicy"}


def _render(dc, release: str, namespace: str, *sets: str) -> list[dict]:
    args = ["template", release, str(CHART), "--namespace", namespace, "--set", "crds.enabled=false"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(dc.helm(*args)) if d]


@pytest.fixture
def other_namespace(devcluster):
    name = f"t-{uuid.uuid4().hex[:8]}"
    devcluster.create_namespace(name)
    try:
        yield name
    finally:
        devcluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture
def release(devcluster, namespace):
    """The chart's RBAC, ServiceAccounts, Secrets and NetworkPolicies applied for a unique release
    watching ``namespace`` (restricted PodSecurity); ``(name, docs)``. Cluster objects removed after."""
    name = f"sec{uuid.uuid4().hex[:6]}"
    devcluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                       "pod-security.kubernetes.io/enforce-version=latest")
    docs = _render(devcluster, name, namespace)
    devcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([d for d in docs if d["kind"] in APPLIED]))
    try:
        yield name, docs
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            devcluster.kubectl("delete", kind, f"{name}-lifeline-operator", "--ignore-not-found")


def _can(dc, sa: str, verb: str, resource: str, namespace: str = "", group: str = "", subresource: str = "") -> bool:
    authz = client.AuthorizationV1Api(dc.api_client())
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{sa}", groups=["system:serviceaccounts", f"system:serviceaccounts:{sa.split(':')[0]}"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace or None,
                                                        group=group, subresource=subresource or None)))
    return authz.create_subject_access_review(review).status.allowed


def _as(dc, namespace: str, sa: str) -> client.ApiClient:
    api = dc.api_client()
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{sa}")
    return api


def test_operator_can_do_its_work_and_is_denied_pods_cluster_wide(devcluster, namespace, other_namespace, release):
    name, _ = release
    op = f"{namespace}:{name}-lifeline-operator"
    needed = [  # (verb, resource, namespace, group, subresource): what a reconcile does
        ("list", "pods", namespace, "", ""), ("watch", "pods", namespace, "", ""),
        ("create", "pods", namespace, "", ""), ("delete", "pods", namespace, "", ""),
        ("get", "secrets", namespace, "", ""), ("create", "secrets", namespace, "", ""),
        ("get", "networkpolicies", namespace, "networking.k8s.io", ""),
        ("create", "networkpolicies", namespace, "networking.k8s.io", ""),
        ("get", "poddisruptionbudgets", namespace, "policy", ""),
        ("create", "poddisruptionbudgets", namespace, "policy", ""),
        ("patch", "poddisruptionbudgets", namespace, "policy", ""),
        ("patch", "trainingjobs", namespace, "lifeline.dev", ""),
        ("patch", "trainingjobs", namespace, "lifeline.dev", "status"),
        ("create", "events", namespace, "", ""), ("list", "nodes", "", "", ""), ("watch", "nodes", "", "", ""),
        ("list", "customresourcedefinitions", "", "apiextensions.k8s.io", ""),
    ]
    denied = [
        ("list", "pods", "", "", ""), ("list", "pods", other_namespace, "", ""), ("get", "pods", other_namespace, "", ""),
        ("get", "secrets", other_namespace, "", ""), ("list", "secrets", namespace, "", ""),
        ("delete", "secrets", namespace, "", ""), ("update", "secrets", namespace, "", ""),
        ("delete", "networkpolicies", namespace, "networking.k8s.io", ""),
        ("delete", "poddisruptionbudgets", namespace, "policy", ""),
        ("create", "poddisruptionbudgets", other_namespace, "policy", ""),
        ("create", "pods", other_namespace, "", ""), ("update", "nodes", "", "", ""),
        ("create", "clusterroles", "", "rbac.authorization.k8s.io", ""),
    ]
    assert [a for a in needed if not _can(devcluster, op, *a)] == []
    assert [a for a in denied if _can(devcluster, op, *a)] == []
    # the same as real requests impersonating the ServiceAccount
    core = client.CoreV1Api(_as(devcluster, namespace, f"{name}-lifeline-operator"))
    core.list_namespaced_pod(namespace)
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces()
    assert err.value.status == 403
    wl = f"{namespace}:{name}-lifeline-workload"
    assert _can(devcluster, wl, "get", "trainingjobs", namespace, "lifeline.dev")
    assert not any(_can(devcluster, wl, v, r, namespace) for v, r in (("list", "pods"), ("get", "secrets")))


def test_cluster_wide_pod_listing_is_opt_in(devcluster, namespace, other_namespace, release):
    name, _ = release
    op = f"{namespace}:{name}-lifeline-operator"
    assert not _can(devcluster, op, "list", "pods")
    opted = _render(devcluster, name, namespace, "operator.listPodsClusterWide=true")
    devcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([d for d in opted if d["kind"] == "ClusterRole"]))
    assert _can(devcluster, op, "list", "pods")  # read-only list in every namespace, nothing more
    assert not any(_can(devcluster, op, v, "pods", ns) for v, ns in (("watch", ""), ("get", other_namespace),
                                                                     ("delete", other_namespace)))
    client.CoreV1Api(_as(devcluster, namespace, f"{name}-lifeline-operator")).list_pod_for_all_namespaces()


def _pod(name: str, namespace: str, spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_every_pod_passes_restricted_pod_security(devcluster, namespace, release):
    """PodSecurity admission (restricted) admits the chart's pods and the operator's rank pods; the
    same rank pod without our security contexts is refused, so the check is real."""
    _, docs = release
    core = client.CoreV1Api(devcluster.api_client())
    for d in docs:
        if d["kind"] == "Deployment":
            spec = copy.deepcopy(d["spec"]["template"]["spec"])
            core.create_namespaced_pod(namespace, _pod(d["metadata"]["name"], namespace, spec), dry_run="All")
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()))
    pod = rank_pod(load_trainingjob(body), 0, generation=0, config=PodConfig(redis_url="redis://r:6379/0"))
    op_core = client.CoreV1Api(_as(devcluster, namespace, f"{release[0]}-lifeline-operator"))
    op_core.create_namespaced_pod(namespace, pod, dry_run="All")  # as the operator, through its RBAC
    bare = copy.deepcopy(pod)
    bare["spec"].pop("securityContext")
    for c in bare["spec"]["containers"]:
        c.pop("securityContext")
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, bare, dry_run="All")
    assert err.value.status == 403 and "PodSecurity" in err.value.body


@pytest.fixture
def trainingjob(devcluster, namespace):
    """The example TrainingJob created in ``namespace`` (no operator runs: nothing reacts to it)."""
    crd = yaml.safe_load((ROOT / "crds" / "trainingjobs.lifeline.dev.yaml").read_text())
    if not devcluster.kubectl("get", "crd", crd["metadata"]["name"], "--ignore-not-found", "-o", "name").strip():
        devcluster.kubectl("create", "-f", "-", input=yaml.safe_dump(crd))
    devcluster.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    custom = client.CustomObjectsApi(devcluster.api_client())
    created = custom.create_namespaced_custom_object("lifeline.dev", "v1alpha1", namespace, "trainingjobs", body)
    return load_trainingjob(created)


def test_operator_gives_a_job_its_secret_acl_user_and_network_policy(devcluster, namespace, release, trainingjob,
                                                                     tmp_path):
    """As the operator's ServiceAccount: the job's Secret carries its own Redis ACL user, which reaches
    the job's keys only; the job's NetworkPolicy admits only the job's pods; its PodDisruptionBudget lets one
    of them be evicted at a time."""
    name, _ = release
    admin_password = "p" * 40
    with RedisServer(state_dir=tmp_path / "redis", password=admin_password) as redis_server:
        settings = OperatorSettings(redis_url=redis_server.url, redis_password=admin_password, redis_job_users=True,
                                    namespaces=[namespace])
        api = _as(devcluster, namespace, f"{name}-lifeline-operator")
        env = Env(core=client.CoreV1Api(api), custom=client.CustomObjectsApi(api), settings=settings)
        data = ensure_secret(env, trainingjob)
        assert data["redis-username"] == "lifeline-job-gpt-moe" and len(data["redis-password"]) == 64
        assert ensure_secret(env, trainingjob) == data  # read back, not recreated
        admin = env.catalog("gpt-moe", 1)
        ensure_redis_user(admin, data)
        admin.add_holding(2, 0, "L0", 0)
        Catalog(redis_server.url, "other-job", 1, username="", password=admin_password).add_holding(2, 0, "L0", 0)
        ensure_network_policy(env, trainingjob)
        ensure_network_policy(env, trainingjob)  # idempotent
        ensure_disruption_budget(env, trainingjob, 4)
        ensure_disruption_budget(env, trainingjob, 4)  # idempotent
        own = Catalog(redis_server.url, "gpt-moe", 1, username=data["redis-username"], password=data["redis-password"])
        assert own.holder_names(2, 0) == {"L0@0"}
        stranger = Catalog(redis_server.url, "other-job", 1, username=data["redis-username"],
                           password=data["redis-password"])
        with pytest.raises(Exception, match="(?i)no permissions"):
            stranger.holder_names(2, 0)
        for c in (admin, own, stranger):
            c.close()
    secret = client.CoreV1Api(devcluster.api_client()).read_namespaced_secret(secret_name("gpt-moe"), namespace)
    assert base64.b64decode(secret.data["redis-password"]).decode() == data["redis-password"]
    pol = client.NetworkingV1Api(devcluster.api_client()).read_namespaced_network_policy(
        network_policy_name("gpt-moe"), namespace)
    assert pol.spec.pod_selector.match_labels == {"lifeline.dev/job": "gpt-moe"}
    assert pol.spec.policy_types == ["Ingress"]
    assert [p.pod_selector.match_labels for r in pol.spec.ingress for p in r._from] == [{"lifeline.dev/job": "gpt-moe"}]
    assert pol.metadata.owner_references[0].uid == trainingjob.metadata["uid"]
    pdb = client.PolicyV1Api(devcluster.api_client()).read_namespaced_pod_disruption_budget(
        disruption_budget_name("gpt-moe"), namespace)
    assert (pdb.spec.min_available, pdb.spec.selector.match_labels) == (3, {"lifeline.dev/job": "gpt-moe"})
    assert pdb.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
    assert pdb.metadata.owner_references[0].uid == trainingjob.metadata["uid"]


def test_the_jobs_disruption_budget_lets_evictions_take_one_pod_at_a_time(devcluster, namespace, trainingjob):
    """The real apiserver's Eviction API under the job's PodDisruptionBudget (the disruption controller of
    the dev cluster's kube-controller-manager counts the healthy pods): as ``kubectl drain`` does, the
    first eviction of a job's pod passes, the second is refused (429) while the first pod is not back."""
    from types import SimpleNamespace

    from lifeline._poll import wait_for

    api = devcluster.api_client()
    core = client.CoreV1Api(api)
    ensure_disruption_budget(SimpleNamespace(core=core), trainingjob, 3)  # a 3-rank job shrunk to 2 pods...
    ensure_disruption_budget(SimpleNamespace(core=core), trainingjob, 2)  # ...and the budget follows
    for name in ("gpt-moe-0", "gpt-moe-1"):
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"lifeline.dev/job": "gpt-moe"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [
                {"name": "trainer", "image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(600)"]}]}})
    policy = client.PolicyV1Api(api)

    def budget_counts_both_pods() -> bool:
        st = policy.read_namespaced_pod_disruption_budget(disruption_budget_name("gpt-moe"), namespace).status
        return st is not None and st.current_healthy == 2 and st.disruptions_allowed == 1

    wait_for(budget_counts_both_pods, timeout=90, what="the budget to count both pods", interval=0.5)

    def evict(name: str) -> None:
        core.create_namespaced_pod_eviction(name, namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace)))

    evict("gpt-moe-0")
    with pytest.raises(ApiException) as err:
        evict("gpt-moe-1")
    assert err.value.status == 429 and "disruption budget" in err.value.body
