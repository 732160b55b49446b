"""spec.py: an invalid TrainingJob becomes a Failed status naming the field and the fix."""

from __future__ import annotations

import pytest

from lifeline.errors import ConfigError
from lifeline.operator.spec import REASON_INVALID_SPEC, InvalidSpec, parse_job


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
