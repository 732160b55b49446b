"""Preemption on Kubernetes (docs/preemption.md): the pod's grace reaches both containers, the trainer
knows whether to wait for L1, and the job's PodDisruptionBudget lets a drain take one pod at a time
(pure builders, no cluster)."""

from __future__ import annotations

import copy

from lifeline.api.disruption import MAX_UNAVAILABLE, disruption_budget_name, job_disruption_budget, min_available
from lifeline.api.load import load_trainingjob
from lifeline.api.manifests import LABEL_JOB, TERMINATION_GRACE_SECONDS, PodConfig, rank_pod
from lifeline.api.pod import SidecarSettings, TrainerSettings
from lifeline.launch.env import Secrets, rank_processes
from lifeline.runtime._preempt import PREEMPT_ENV, _peer_replicas

CONFIG = PodConfig(redis_url="redis://10.0.0.5:6379/0")


def _env(pod: dict, container: str) -> dict[str, str]:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    return {e["name"]: e.get("value") for e in c["env"]}


def _with_template(job_body: dict, **spec) -> object:
    body = copy.deepcopy(job_body)
    body["spec"]["template"]["spec"].update(spec)
    return load_trainingjob(body)


def test_the_pods_grace_defaults_to_lifelines_and_reaches_both_containers(job):
    pod = rank_pod(job, 2, generation=0, config=CONFIG)
    assert pod["spec"]["terminationGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS == 60
    for name in ("trainer", "sidecar"):
        assert _env(pod, name)[PREEMPT_ENV] == "60"
    sidecar = SidecarSettings(**_settings_of(pod, "sidecar"))
    assert sidecar.preempt_grace_seconds == 60.0


def test_a_template_grace_is_kept_and_zero_turns_preemption_handling_off(job_body):
    pod = rank_pod(_with_template(job_body, terminationGracePeriodSeconds=300), 0, generation=0, config=CONFIG)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 300
    assert _env(pod, "trainer")[PREEMPT_ENV] == _env(pod, "sidecar")[PREEMPT_ENV] == "300"
    off = rank_pod(_with_template(job_body, terminationGracePeriodSeconds=0), 0, generation=0, config=CONFIG)
    assert off["spec"]["terminationGracePeriodSeconds"] == 0 and _env(off, "trainer")[PREEMPT_ENV] == "0"


def test_the_trainer_knows_the_jobs_peer_replicas(job, job_body):
    trainer = TrainerSettings(**_settings_of(rank_pod(job, 1, generation=0, config=CONFIG), "trainer"))
    assert trainer.peer_replicas == 1 and _peer_replicas(trainer) == 1
    body = copy.deepcopy(job_body)
    body["spec"]["checkpoint"]["peerReplicas"] = 0
    pod = rank_pod(load_trainingjob(body), 1, generation=0, config=CONFIG)
    assert _env(pod, "trainer")["LIFELINE_PEER_REPLICAS"] == _env(pod, "sidecar")["LIFELINE_PEER_REPLICAS"] == "0"
    trainer = TrainerSettings(**_settings_of(pod, "trainer"))
    assert _peer_replicas(trainer) == 0  # a preempted trainer does not wait for an L1 copy


def test_lifeline_run_turns_preemption_on_only_with_a_preempt_injection(job, tmp_path):
    assert PREEMPT_ENV not in _env(rank_pod(job, 0, generation=0, config=PodConfig(
        redis_url="redis://x:1/0", preemption=False)), "trainer")
    common = dict(layout=job.spec.layout, generation=0, node="node-1", pod_ip="127.0.0.2", arena_dir=tmp_path,
                  redis_url="redis://127.0.0.1:1/0", secrets=Secrets("k" * 32, "", ""))
    plain = rank_processes(job, 0, **common)
    assert PREEMPT_ENV not in plain.trainer.env and PREEMPT_ENV not in plain.sidecar.env
    injected = rank_processes(job, 0, extra_env={PREEMPT_ENV: "10"}, **common)
    assert injected.trainer.env[PREEMPT_ENV] == injected.sidecar.env[PREEMPT_ENV] == "10"


def test_job_disruption_budget_lets_a_drain_take_one_pod_at_a_time(job):
    pdb = job_disruption_budget(job, 4)
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert (pdb["metadata"]["name"], pdb["metadata"]["namespace"]) == (disruption_budget_name("gpt-moe"), "team-a")
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == job.metadata["uid"]
    assert pdb["spec"] == {"selector": {"matchLabels": {LABEL_JOB: "gpt-moe"}}, "minAvailable": 3,
                           "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert MAX_UNAVAILABLE == 1 and min_available(2) == 1 and min_available(1) == 0  # one rank: always evictable
    for rank in range(job.spec.layout.world_size):  # the selector matches every rank pod
        assert rank_pod(job, rank, generation=0, config=CONFIG)["metadata"]["labels"][LABEL_JOB] == "gpt-moe"


def _settings_of(pod: dict, container: str) -> dict:
    """The container's plain-valued LIFELINE_* variables as settings fields, plus what the kubelet resolves."""
    out = {k.removeprefix("LIFELINE_").lower(): v for k, v in _env(pod, container).items()
           if v is not None and k not in ("LIFELINE_LAYOUT", "LIFELINE_MODEL")}
    return {**out, "secret": "k" * 32, "node": "n", "pod_ip": "10.0.0.9"}
