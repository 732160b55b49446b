"""The helm chart, rendered by a real helm (built from source by lifeline.devcluster): objects,
RBAC hygiene, in-cluster vs external services, values validation by values.schema.json."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from lifeline.devcluster.build import binary
from lifeline.operator.settings import OperatorSettings

CHART = Path(__file__).resolve().parents[2] / "helm" / "lifeline"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(binary("helm"))


def _render(helm: str, *sets: str, namespace: str = "lifeline-system", check: bool = True):
    args = [helm, "template", "ll", str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if not check:
        return out
    assert out.returncode == 0, out.stderr
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def _find(docs, kind, name=None, namespace=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
            and (namespace is None or d["metadata"].get("namespace") == namespace)]


def _operator_env(docs) -> dict:
    (dep,) = _find(docs, "Deployment", "ll-lifeline-operator")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c["env"]}


def test_default_render_objects(helm):
    _, docs = _render(helm)
    kinds = sorted({(d["kind"], d["metadata"]["name"]) for d in docs})
    for expected in [
        ("CustomResourceDefinition", "trainingjobs.lifeline.dev"),
        ("Deployment", "ll-lifeline-operator"),
        ("ServiceAccount", "ll-lifeline-operator"),
        ("ClusterRole", "ll-lifeline-operator"),
        ("ClusterRoleBinding", "ll-lifeline-operator"),
        ("Role", "ll-lifeline-operator"),
        ("RoleBinding", "ll-lifeline-operator"),
        ("ServiceAccount", "ll-lifeline-workload"),
        ("Role", "ll-lifeline-workload"),
        ("Deployment", "ll-lifeline-redis"),
        ("Service", "ll-lifeline-redis"),
        ("Deployment", "ll-lifeline-minio"),
        ("Service", "ll-lifeline-minio"),
        ("Secret", "ll-lifeline-object-storage"),
    ]:
        assert expected in kinds
    (dep,) = _find(docs, "Deployment", "ll-lifeline-operator")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ll-lifeline-operator"
    assert pod["containers"][0]["command"] == ["python", "-m", "lifeline", "operator"]
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = _operator_env(docs)
    assert env["LIFELINE_OPERATOR_REDIS_URL"]["value"] == "redis://ll-lifeline-redis.lifeline-system.svc:6379/0"
    assert env["LIFELINE_OPERATOR_S3_ENDPOINT"]["value"] == "ll-lifeline-minio.lifeline-system.svc:9000"
    assert env["LIFELINE_OPERATOR_NAMESPACES"]["value"] == "lifeline-system"
    assert env["LIFELINE_OPERATOR_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "ll-lifeline-object-storage"


def test_operator_env_is_what_the_operator_reads(helm):
    _, docs = _render(helm)
    values = {k.removeprefix("LIFELINE_OPERATOR_").lower(): e.get("value", "from-secret")
              for k, e in _operator_env(docs).items()}
    assert set(values) <= set(OperatorSettings.model_fields)
    settings = OperatorSettings.load(**values)
    assert settings.namespaces == ["lifeline-system"] and settings.pod_service_account == "ll-lifeline-workload"
    assert settings.sidecar_resources == {"requests": {"cpu": "250m", "memory": "256Mi"}}


@pytest.mark.parametrize("mode", ["operator.clusterWide=true", "operator.clusterWide=false"])
def test_rbac_rules_commented_and_without_wildcards(helm, mode):
    text, docs = _render(helm, mode)
    lines = [ln.strip() for ln in text.splitlines()]
    rule_lines = [i for i, ln in enumerate(lines) if ln.startswith("- apiGroups:")]
    assert rule_lines
    for i in rule_lines:
        assert lines[i - 1].startswith("#"), f"RBAC rule without a comment: {lines[i]}"
    for d in docs:
        for rule in d.get("rules", []) if d["kind"] in ("Role", "ClusterRole") else []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (d["metadata"]["name"], rule)


def test_namespaced_rights_by_default(helm):
    _, docs = _render(helm, "operator.namespaces={team-a,team-b}")
    (cr,) = _find(docs, "ClusterRole", "ll-lifeline-operator")
    # cluster-wide: read-only nodes (failure signals), what kopf observes (namespaces, CRDs), and a
    # list of pods (node capacity for elastic reshards) without get/watch/create/delete
    watch = ["get", "list", "watch"]
    assert [(r["resources"], r["verbs"]) for r in cr["rules"]] == [
        (["nodes"], watch), (["namespaces"], watch), (["customresourcedefinitions"], watch), (["pods"], ["list"])]
    _, without = _render(helm, "operator.nodeCapacity=false")
    (cr_without,) = _find(without, "ClusterRole", "ll-lifeline-operator")
    assert all(r["resources"] != ["pods"] for r in cr_without["rules"])
    for ns in ("team-a", "team-b"):
        (role,) = _find(docs, "Role", "ll-lifeline-operator", ns)
        secrets = next(r for r in role["rules"] if r["resources"] == ["secrets"])
        assert secrets["verbs"] == ["get", "create"]
        (sa,) = _find(docs, "ServiceAccount", "ll-lifeline-workload", ns)
        assert sa["automountServiceAccountToken"] is False
    assert not _find(docs, "Role", "ll-lifeline-operator", "lifeline-system")
    assert _operator_env(docs)["LIFELINE_OPERATOR_NAMESPACES"]["value"] == "team-a,team-b"


def test_cluster_wide_mode(helm):
    _, docs = _render(helm, "operator.clusterWide=true")
    (cr,) = _find(docs, "ClusterRole", "ll-lifeline-operator")
    assert {"secrets", "pods", "trainingjobs", "namespaces"} <= {res for r in cr["rules"] for res in r["resources"]}
    assert not _find(docs, "Role", "ll-lifeline-operator")
    assert _operator_env(docs)["LIFELINE_OPERATOR_NAMESPACES"]["value"] == ""


def test_external_redis_and_object_storage(helm):
    _, docs = _render(helm, "redis.external.url=redis://127.0.0.1:6390/0",
                      "objectStorage.external.endpoint=127.0.0.1:9010", "crds.enabled=false")
    assert not _find(docs, "Deployment", "ll-lifeline-redis") and not _find(docs, "Deployment", "ll-lifeline-minio")
    assert not _find(docs, "CustomResourceDefinition")
    env = _operator_env(docs)
    assert env["LIFELINE_OPERATOR_REDIS_URL"]["value"] == "redis://127.0.0.1:6390/0"
    assert env["LIFELINE_OPERATOR_S3_ENDPOINT"]["value"] == "127.0.0.1:9010"


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("operator.resyncSeconds=0", "resyncSeconds"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("redis.external.url=http://x", "url"),
        ("operator.metricsPort=70000", "metricsPort"),
        ("operator.replicaz=2", "replicaz"),
    ],
)
def test_schema_rejects_bad_values(helm, setting, words):
    out = _render(helm, setting, check=False)
    assert out.returncode != 0 and words in out.stderr, out.stderr
