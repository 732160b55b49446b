"""spec.py: an invalid TrainingJob (or a pod template no valid pod comes from) becomes a Failed status naming the
field and the fix; recorded.py reads unreadable record annotations as defaults."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from lifeline.api.manifests import PodConfig
from lifeline.errors import ConfigError
from lifeline.operator.recorded import Recorded
from lifeline.operator.spec import (MAX_MESSAGE, REASON_INVALID_SPEC, InvalidSpec, build_pod, invalid_spec, parse_job,
                                    pod_refused, refuses_the_pod)


def test_valid_body_parses(job_body):
    job = parse_job({**job_body, "status": {"phase": "Running", "kopf": {}}})
    assert job.name == "gpt-moe" and job.spec.replicas == 4 and job.metadata["uid"]


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda s: s.update(replicas=3), "spec.replicas", "must equal the product"),
        (lambda s: s["template"]["spec"]["containers"][0].update(name="main"), "spec.template.spec.containers", "trainer"),
        (lambda s: s["checkpoint"].update(every=3), "spec.checkpoint.persist.every", "multiple"),
        (lambda s: s.update(stepz=3), "spec.stepz", "unknown field"),
    ],
)
def test_invalid_spec_fails_with_reason(job_body, mutate, field, words):
    mutate(job_body["spec"])
    job_body["status"] = {"phase": "Running", "step": 7}
    with pytest.raises(InvalidSpec) as info:
        parse_job(job_body)
    err = info.value
    assert isinstance(err, ConfigError) and err.field == field and err.job == "gpt-moe"
    assert words in err.message
    st = err.status
    assert st["phase"] == "Failed" and st["step"] == 7 and st["observedGeneration"] == 1
    assert {c["reason"] for c in st["conditions"]} == {REASON_INVALID_SPEC}
    assert {c["type"]: c["status"] for c in st["conditions"]}["Degraded"] == "True"
    assert field in st["message"]


def test_a_template_no_pod_can_be_built_from_is_an_invalid_spec(job_body):
    """The CRD types the fields the operator merges into; a shape it leaves open that still breaks
    the manifest (here a node affinity that is a string) fails the job, never a Python error."""
    job_body["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": "anywhere"}
    job = parse_job(job_body)
    with pytest.raises(InvalidSpec) as info:
        build_pod(job_body, job, 0, generation=0, config=PodConfig(redis_url="redis://r:6379/0"), avoid_nodes=["n1"])
    err = info.value
    assert err.field == "spec.template" and "cannot be made into a pod" in err.message
    assert err.status["phase"] == "Failed" and {c["reason"] for c in err.status["conditions"]} == {REASON_INVALID_SPEC}


def test_a_pod_the_api_server_refuses_is_an_invalid_spec_quoting_the_server(job_body):
    refusal = ApiException(status=422, reason="Unprocessable Entity")
    refusal.body = json.dumps({"kind": "Status", "message": 'Pod "gpt-moe-0" is invalid: '
                               "spec.containers[0].ports[0].containerPort: Invalid value: -1"})
    err = pod_refused(job_body, "gpt-moe-0", refusal)
    assert "spec.containers[0].ports[0].containerPort" in err.message and "spec.template is invalid" in err.message
    assert err.status["phase"] == "Failed" and err.status["observedGeneration"] == 1


def test_a_huge_message_is_cut(job_body):
    err = invalid_spec(job_body, "x" * 100_000, field="spec.template")
    assert len(err.message) == MAX_MESSAGE and err.status["message"] == err.message


@pytest.mark.parametrize("annotations", [
    {"lifeline.dev/applied": "[1]"}, {"lifeline.dev/generation": '"abc"'}, {"lifeline.dev/generation": "1e999"},
    {"lifeline.dev/handled": "[]"}, {"lifeline.dev/handled": '{"uid": {"trainer": "x"}}'},
    {"lifeline.dev/cool-downs": '{"n1": "soon"}'}, {"lifeline.dev/plan": "{}"}, {"lifeline.dev/plan": "not json"},
    {"lifeline.dev/applied": "true"},
])
def test_unreadable_record_annotations_read_as_defaults(annotations):
    assert Recorded.from_annotations(annotations) == Recorded()


def test_a_pod_the_client_refuses_before_sending_is_an_invalid_spec(job_body):
    """kubernetes-client validates a pod body locally (pydantic) before any request: a map where
    ``containerPort`` belongs never reaches the API server, and is just as permanent."""
    from kubernetes import client
    from pydantic import ValidationError

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpt-moe-0"},
           "spec": {"containers": [{"name": "trainer", "ports": [{"containerPort": {"weird": "port"}}]}]}}
    with pytest.raises(ValidationError) as info:
        client.CoreV1Api(client.ApiClient()).create_namespaced_pod("team-a", pod)
    err = pod_refused(job_body, "gpt-moe-0", info.value)
    assert "spec.containers.0.ports.0.containerPort" in err.message and err.field == "spec.template"
    assert err.status["phase"] == "Failed"


def _answer(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="x")
    err.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return err


@pytest.mark.parametrize(("status", "message", "refused"), [
    (422, 'Pod "j-0" is invalid: spec.containers[0].ports[0].containerPort: Invalid value: -1', True),
    (400, "quantities must match the regular expression", True),
    (403, 'pods "j-0" is forbidden: the integer value of priority (60) must not be provided in pod spec', True),
    (403, 'pods "j-0" is forbidden: violates PodSecurity "restricted:latest": privileged', True),
    (403, 'pods is forbidden: User "system:serviceaccount:a:op" cannot create resource "pods"', False),
    (403, 'pods "j-0" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=8, limited: cpu=8', False),
    (403, "unable to create new content in namespace a because it is being terminated", False),
    (409, 'pods "j-0" already exists', False),
    (500, "etcdserver: request timed out", False),
])
def test_which_refusals_of_a_pod_fail_the_job(status, message, refused):
    """A refusal of the pod itself is permanent (the job fails once); rights, quota, a namespace
    going away and server trouble are retried."""
    assert refuses_the_pod(_answer(status, message)) is refused
