"""manifests.py: the per-rank Pod and the job Secret, checked field by field (pure, no cluster)."""

from __future__ import annotations

import json

import pytest

from lifeline.api.load import load_trainingjob
from lifeline.api.pod import SidecarSettings, TrainerSettings
from lifeline.api.trainingjob import LayoutSpec
from lifeline.api.manifests import (
    ARENA_MOUNT,
    ARENA_VOLUME,
    LABEL_GENERATION,
    LABEL_JOB,
    LABEL_RANK,
    PodConfig,
    job_secret,
    rank_pod,
    secret_name,
)

CONFIG = PodConfig(
    redis_url="redis://10.0.0.5:6379/0",
    service_account="lifeline-workload",
    s3_endpoint="minio.lifeline.svc:9000",
    sidecar_resources={"requests": {"cpu": "250m"}},
)


def _container(pod: dict, name: str) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def _resolved_env(container: dict, *, node: str, pod_ip: str, secret: dict[str, str]) -> dict[str, str]:
    """What the kubelet would hand the process: downward API and secretKeyRef resolved."""
    out = {}
    for e in container["env"]:
        if "value" in e:
            out[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            out[e["name"]] = {"spec.nodeName": node, "status.podIP": pod_ip}[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["key"] in secret:
                out[e["name"]] = secret[ref["key"]]
            else:  # the kubelet leaves an optional missing key unset and refuses a required one
                assert ref.get("optional") is True, f"{e['name']}: required Secret key {ref['key']} missing"
    return out


def test_one_pod_per_rank_named_and_labelled(job):
    pods = [rank_pod(job, r, generation=3, config=CONFIG) for r in range(job.spec.replicas)]
    assert [p["metadata"]["name"] for p in pods] == ["gpt-moe-0", "gpt-moe-1", "gpt-moe-2", "gpt-moe-3"]
    for r, p in enumerate(pods):
        labels = p["metadata"]["labels"]
        assert (labels[LABEL_JOB], labels[LABEL_RANK], labels[LABEL_GENERATION]) == ("gpt-moe", str(r), "3")
        assert p["metadata"]["namespace"] == "team-a"
        (owner,) = p["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "lifeline.dev/v1alpha1",
            "kind": "TrainingJob",
            "name": "gpt-moe",
            "uid": job.metadata["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_sidecar_injected_with_shared_memory_volume(job):
    pod = rank_pod(job, 0, generation=0, config=CONFIG)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["trainer", "sidecar"]
    sidecar = _container(pod, "sidecar")
    assert sidecar["command"] == ["python", "-m", "lifeline", "sidecar"]
    assert sidecar["image"] == _container(pod, "trainer")["image"] == "lifeline:dev"
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 9400}
    assert {p["containerPort"] for p in sidecar["ports"]} == {7070, 9400}
    assert sidecar["resources"] == {"requests": {"cpu": "250m"}}
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == ARENA_VOLUME]
    assert vol["emptyDir"]["medium"] == "Memory"
    for name in ("trainer", "sidecar"):
        assert {"name": ARENA_VOLUME, "mountPath": ARENA_MOUNT} in _container(pod, name)["volumeMounts"]
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["spec"]["serviceAccountName"] == "lifeline-workload"


def test_arena_size_limit_follows_memory_limit(job_body):
    job_body["spec"]["checkpoint"]["memoryLimit"] = "2Gi"
    pod = rank_pod(load_trainingjob(job_body), 0, generation=0, config=CONFIG)
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == ARENA_VOLUME]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": str(2 << 30)}
    assert _env(_container(pod, "sidecar"))["LIFELINE_MEMORY_BYTES"]["value"] == str(2 << 30)


def test_secrets_only_by_reference(job):
    pod = rank_pod(job, 2, generation=0, config=CONFIG)
    for name in ("trainer", "sidecar"):
        env = _env(_container(pod, name))
        assert env["LIFELINE_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "gpt-moe-lifeline", "key": "hmac-key"}
        assert env["LIFELINE_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["LIFELINE_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    side = _env(_container(pod, "sidecar"))
    assert side["LIFELINE_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == secret_name("gpt-moe")
    assert "value" not in side["LIFELINE_S3_ACCESS_KEY"]


def test_on_the_dev_cluster_the_arena_lies_in_the_pods_own_volume(job, monkeypatch, tmp_path):
    """A process pod shares the host's /dev/shm: its arena goes into the arena volume's directory
    (which the node removes with the pod), named by the variable the dev cluster sets for it."""
    from lifeline.api.pod import ARENA_MOUNT_ENV
    from lifeline.devcluster.node.volumes import mount_env_name

    assert mount_env_name(ARENA_VOLUME) == ARENA_MOUNT_ENV
    monkeypatch.setenv(ARENA_MOUNT_ENV, str(tmp_path / "volume"))
    pod = rank_pod(job, 3, generation=1, config=CONFIG)
    secret = {"hmac-key": "k" * 64, "s3-access-key": "ak", "s3-secret-key": "sk"}
    side = _resolved_env(_container(pod, "sidecar"), node="node-b", pod_ip="10.1.0.7", secret=secret)
    sidecar = SidecarSettings.load(**{k.removeprefix("LIFELINE_").lower(): v for k, v in side.items()})
    assert sidecar.arena_dir == tmp_path / "volume" and sidecar.socket_path == tmp_path / "volume" / "sidecar.sock"


def test_env_validates_as_the_roles_settings(job):
    """The env the operator writes is what lifeline.api.pod accepts: no typo, no missing field."""
    pod = rank_pod(job, 3, generation=1, config=CONFIG)
    secret = {"hmac-key": "k" * 64, "s3-access-key": "ak", "s3-secret-key": "sk",
              "redis-username": "lifeline-job-gpt-moe", "redis-password": "r" * 64}
    side = _resolved_env(_container(pod, "sidecar"), node="node-b", pod_ip="10.1.0.7", secret=secret)
    sidecar = SidecarSettings.load(**{k.removeprefix("LIFELINE_").lower(): v for k, v in side.items()})
    assert (sidecar.redis_username, sidecar.redis_password.get_secret_value()) == ("lifeline-job-gpt-moe", "r" * 64)
    assert (sidecar.job, sidecar.rank, sidecar.world_size, sidecar.node) == ("gpt-moe", 3, 4, "node-b")
    assert (sidecar.pod_ip, sidecar.peer_port, sidecar.redis_url) == ("10.1.0.7", 7070, CONFIG.redis_url)
    assert (sidecar.persist_uri, sidecar.persist_every, sidecar.peer_replicas) == ("s3://lifeline/checkpoints", 10, 1)
    assert (sidecar.s3_endpoint, sidecar.s3_access_key) == ("minio.lifeline.svc:9000", "ak")
    assert sidecar.secret.get_secret_value() == "k" * 64
    trn = _resolved_env(_container(pod, "trainer"), node="node-b", pod_ip="10.1.0.7", secret=secret)
    trainer = TrainerSettings.load(**{k.removeprefix("LIFELINE_").lower(): json.loads(v) if k in
                                      ("LIFELINE_LAYOUT", "LIFELINE_MODEL") else v for k, v in trn.items()})
    assert trainer.layout == {"tensor": 1, "pipeline": 2, "data": 2, "expert": 1}
    assert (trainer.steps, trainer.checkpoint_every, trainer.model) == (60, 1, {"seed": 0})
    assert trainer.generation is None  # joins the catalog's current generation (survives in-place restarts)
    assert trainer.arena_dir == sidecar.arena_dir  # both default into the shared /dev/shm volume
    assert str(trainer.arena_dir).startswith(ARENA_MOUNT + "/")
    # an elastic reshard restores from L2: the trainer reaches the same store as the sidecar
    assert (trainer.persist_uri, trainer.s3_endpoint, trainer.s3_access_key, trainer.s3_secure) == \
        (sidecar.persist_uri, sidecar.s3_endpoint, sidecar.s3_access_key, sidecar.s3_secure)
    assert trainer.s3_secret_key.get_secret_value() == "sk"
    assert (trainer.redis_username, trainer.redis_password) == (sidecar.redis_username, sidecar.redis_password)


def test_cooldown_nodes_are_anded_into_every_affinity_term(job_body):
    job_body["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                ]
            }
        }
    }
    job = load_trainingjob(job_body)
    pod = rank_pod(job, 0, generation=2, config=CONFIG, avoid_nodes=["node-c", "node-a", "node-c"])
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert term["matchExpressions"][-1] == {
            "key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a", "node-c"]
        }
    # the template itself is untouched (builders are pure)
    assert len(job.spec.template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]) == 1


def test_no_affinity_without_cooldown(job):
    pod = rank_pod(job, 0, generation=0, config=CONFIG)
    assert "affinity" not in pod["spec"]
    pod = rank_pod(job, 0, generation=0, config=CONFIG, avoid_nodes=["n1"])
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}]
    }


def test_user_env_kept_and_ours_wins(job_body):
    trainer = job_body["spec"]["template"]["spec"]["containers"][0]
    trainer["env"] = [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "LIFELINE_RANK", "value": "99"},
        {"name": "LIFELINE_SLOT_BYTES", "value": "1048576"},
    ]
    pod = rank_pod(load_trainingjob(job_body), 1, generation=0, config=CONFIG)
    env = _env(_container(pod, "trainer"))
    assert env["NCCL_DEBUG"]["value"] == "INFO"
    assert env["LIFELINE_RANK"]["value"] == "1"
    assert [e["name"] for e in _container(pod, "trainer")["env"]].count("LIFELINE_RANK") == 1
    # arena sizing is shared: the sidecar maps the same slots
    assert _env(_container(pod, "sidecar"))["LIFELINE_SLOT_BYTES"]["value"] == "1048576"


def test_elastic_layout_sets_world_size(job):
    small = LayoutSpec(tensor=1, pipeline=2, data=1, expert=1)
    pod = rank_pod(job, 1, generation=4, config=CONFIG, layout=small)
    env = _env(_container(pod, "trainer"))
    assert env["LIFELINE_WORLD_SIZE"]["value"] == "2"
    assert json.loads(env["LIFELINE_LAYOUT"]["value"]) == {"tensor": 1, "pipeline": 2, "data": 1, "expert": 1}
    with pytest.raises(ValueError, match="rank 2 is outside"):
        rank_pod(job, 2, generation=4, config=CONFIG, layout=small)


def test_no_s3_env_without_s3_persistence(job_body):
    job_body["spec"]["checkpoint"]["persist"] = {"every": 10, "uri": "file:///data/ckpt"}
    side = _env(_container(rank_pod(load_trainingjob(job_body), 0, generation=0, config=CONFIG), "sidecar"))
    trainer = _env(_container(rank_pod(load_trainingjob(job_body), 0, generation=0, config=CONFIG), "trainer"))
    assert side["LIFELINE_PERSIST_URI"]["value"] == trainer["LIFELINE_PERSIST_URI"]["value"] == "file:///data/ckpt"
    assert not any(k.startswith("LIFELINE_S3_") for k in [*side, *trainer])
    del job_body["spec"]["checkpoint"]["persist"]
    side = _env(_container(rank_pod(load_trainingjob(job_body), 0, generation=0, config=CONFIG), "sidecar"))
    assert side["LIFELINE_PERSIST_EVERY"]["value"] == "0"


def test_job_secret(job):
    sec = job_secret(job, hmac_key="ab" * 32, s3_access_key="ak", s3_secret_key="sk")
    assert sec["metadata"]["name"] == "gpt-moe-lifeline"
    assert sec["metadata"]["ownerReferences"][0]["uid"] == job.metadata["uid"]
    assert sec["stringData"] == {"hmac-key": "ab" * 32, "s3-access-key": "ak", "s3-secret-key": "sk",
                                 "redis-username": "", "redis-password": ""}
    sec = job_secret(job, hmac_key="ab" * 32, redis_username="lifeline-job-gpt-moe", redis_password="p" * 64)
    assert (sec["stringData"]["redis-username"], sec["stringData"]["redis-password"]) == ("lifeline-job-gpt-moe",
                                                                                          "p" * 64)
    with pytest.raises(ValueError, match="at least 16"):
        job_secret(job, hmac_key="short")


RESTRICTED_CONTAINER = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def test_pod_runs_restricted_with_emptydir_writable_paths(job):
    """Non-root, read-only root, no capabilities, no escalation, RuntimeDefault seccomp; the writable
    paths are emptyDirs (the Memory arena at /dev/shm, /tmp) mounted in both containers."""
    pod = rank_pod(job, 0, generation=0, config=CONFIG)
    assert pod["spec"]["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                              "seccompProfile": {"type": "RuntimeDefault"}}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for name in ("trainer", "sidecar"):
        c = _container(pod, name)
        assert c["securityContext"] == RESTRICTED_CONTAINER, name
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert set(mounts) == {"/dev/shm", "/tmp"}
        assert all("emptyDir" in volumes[v] for v in mounts.values())


def test_template_security_choices_are_kept_for_the_trainer_only(job_body):
    spec = job_body["spec"]["template"]["spec"]
    spec["securityContext"] = {"runAsUser": 2000, "fsGroup": 2000}
    spec["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": False}
    spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/tmp"}]
    spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    pod = rank_pod(load_trainingjob(job_body), 0, generation=0, config=CONFIG)
    assert pod["spec"]["securityContext"]["runAsUser"] == 2000 and pod["spec"]["securityContext"]["fsGroup"] == 2000
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    trainer = _container(pod, "trainer")
    assert trainer["securityContext"] == {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": False}
    assert [m["name"] for m in trainer["volumeMounts"] if m["mountPath"] == "/tmp"] == ["scratch"]
    assert _container(pod, "sidecar")["securityContext"] == RESTRICTED_CONTAINER


def test_redis_credentials_only_by_optional_reference(job):
    pod = rank_pod(job, 1, generation=0, config=CONFIG)
    for name in ("trainer", "sidecar"):
        env = _env(_container(pod, name))
        for var, key in (("LIFELINE_REDIS_USERNAME", "redis-username"), ("LIFELINE_REDIS_PASSWORD", "redis-password")):
            assert env[var]["valueFrom"]["secretKeyRef"] == {"name": "gpt-moe-lifeline", "key": key, "optional": True}
        assert "@" not in env["LIFELINE_REDIS_URL"]["value"]  # no credentials in the URL


def test_job_network_policy_admits_only_the_jobs_pods(job):
    from lifeline.api.netpol import job_network_policy

    pol = job_network_policy(job)
    assert (pol["kind"], pol["metadata"]["name"], pol["metadata"]["namespace"]) == \
        ("NetworkPolicy", "gpt-moe-lifeline", "team-a")
    assert pol["metadata"]["ownerReferences"][0]["uid"] == job.metadata["uid"]
    own = {"matchLabels": {LABEL_JOB: "gpt-moe"}}
    assert pol["spec"] == {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}
    pod = rank_pod(job, 0, generation=0, config=CONFIG)
    assert pod["metadata"]["labels"][LABEL_JOB] == "gpt-moe"  # the selector matches every rank pod
