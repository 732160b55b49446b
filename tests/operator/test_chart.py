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
    assert settings.redis_job_users is True and settings.list_pods_cluster_wide is False
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
    # cluster-wide: read-only nodes (failure signals) and what kopf observes (namespaces, CRDs);
    # no pod rule at all: node capacity counts the watched namespaces' pods by default
    watch = ["get", "list", "watch"]
    assert [(r["resources"], r["verbs"]) for r in cr["rules"]] == [
        (["nodes"], watch), (["namespaces"], watch), (["customresourcedefinitions"], watch)]
    assert _operator_env(docs)["LIFELINE_OPERATOR_LIST_PODS_CLUSTER_WIDE"]["value"] == "false"
    _, opted = _render(helm, "operator.listPodsClusterWide=true")
    (cr_opted,) = _find(opted, "ClusterRole", "ll-lifeline-operator")
    assert [r["verbs"] for r in cr_opted["rules"] if r["resources"] == ["pods"]] == [["list"]]
    assert _operator_env(opted)["LIFELINE_OPERATOR_LIST_PODS_CLUSTER_WIDE"]["value"] == "true"
    for ns in ("team-a", "team-b"):
        (role,) = _find(docs, "Role", "ll-lifeline-operator", ns)
        secrets = next(r for r in role["rules"] if r["resources"] == ["secrets"])
        assert secrets["verbs"] == ["get", "create"]
        netpol = next(r for r in role["rules"] if r["resources"] == ["networkpolicies"])
        assert (netpol["apiGroups"], netpol["verbs"]) == (["networking.k8s.io"], ["get", "create"])
        pdb = next(r for r in role["rules"] if r["resources"] == ["poddisruptionbudgets"])
        assert (pdb["apiGroups"], pdb["verbs"]) == (["policy"], ["get", "create", "patch"])
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


def _pod_specs(docs):
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"}


@pytest.mark.parametrize("mode", [(), ("objectStorage.internal.persistence.existingClaim=minio-data",)])
def test_every_pod_runs_restricted(helm, mode):
    """Operator, Redis, MinIO: non-root, RuntimeDefault seccomp, read-only root, all capabilities
    dropped, no escalation; every writable mount is an emptyDir (or MinIO's claim)."""
    _, docs = _render(helm, *mode)
    specs = _pod_specs(docs)
    assert set(specs) == {"ll-lifeline-operator", "ll-lifeline-redis", "ll-lifeline-minio"}
    for name, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True, name
            for m in c.get("volumeMounts", []):
                v = volumes[m["name"]]
                assert "emptyDir" in v or v.get("persistentVolumeClaim", {}).get("claimName") == "minio-data", (name, v)


def test_credentials_only_from_secrets(helm):
    """No credential is literal in values.yaml or in any pod's env: S3 keys and the Redis password
    are secretKeyRefs to chart Secrets whose values are random (none given) and kept on upgrade."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["objectStorage"]["accessKey"] == values["objectStorage"]["secretKey"] == ""
    text, docs = _render(helm)
    second, _ = _render(helm)
    for name, spec in _pod_specs(docs).items():
        for c in spec["containers"]:
            for e in c.get("env", []):
                if any(w in e["name"] for w in ("PASSWORD", "SECRET", "ACCESS_KEY", "ROOT_USER")):
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], (name, e)
    (s3,) = _find(docs, "Secret", "ll-lifeline-object-storage")
    (redis_secret,) = _find(docs, "Secret", "ll-lifeline-redis")
    assert len(s3["data"]["secret-key"]) >= 40 and len(redis_secret["data"]["password"]) >= 40
    assert redis_secret["data"]["password"] not in second  # random per install (lookup keeps it on upgrade)
    redis = _pod_specs(docs)["ll-lifeline-redis"]["containers"][0]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis["env"] == [{"name": "REDIS_PASSWORD",
                             "valueFrom": {"secretKeyRef": {"name": "ll-lifeline-redis", "key": "password"}}}]
    env = _operator_env(docs)
    assert env["LIFELINE_OPERATOR_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ll-lifeline-redis",
                                                                                   "key": "password"}
    # an external Redis without a Secret: no password wiring; with one: the operator reads it
    _, ext = _render(helm, "redis.external.url=redis://10.0.0.5:6379/0")
    assert not _find(ext, "Secret", "ll-lifeline-redis") and "LIFELINE_OPERATOR_REDIS_PASSWORD" not in _operator_env(ext)
    _, ext = _render(helm, "redis.external.url=redis://10.0.0.5:6379/0", "redis.auth.existingSecret=redis-auth")
    assert _operator_env(ext)["LIFELINE_OPERATOR_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "redis-auth"


def test_network_policies_of_redis_and_minio(helm):
    _, docs = _render(helm, "operator.namespaces={team-a,team-b}")
    redis, minio = (_find(docs, "NetworkPolicy", f"ll-lifeline-{c}")[0] for c in ("redis", "minio"))
    assert redis["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    (rule,) = redis["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    operator, training = rule["from"]
    assert operator == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "lifeline",
                        "app.kubernetes.io/instance": "ll", "app.kubernetes.io/component": "operator"}}}
    assert training["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "lifeline-operator"}}
    assert training["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    (rule,) = minio["spec"]["ingress"]
    assert rule["from"] == [training] and rule["ports"] == [{"protocol": "TCP", "port": 9000}]
    _, wide = _render(helm, "operator.clusterWide=true")
    assert _find(wide, "NetworkPolicy", "ll-lifeline-redis")[0]["spec"]["ingress"][0]["from"][1]["namespaceSelector"] == {}
    _, off = _render(helm, "networkPolicy.enabled=false")
    assert not _find(off, "NetworkPolicy")
