"""TrainingJob models: defaults, wire names, and errors that name the field and the fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from lifeline.api import (
    LayoutSpec,
    RecoveryAction,
    TrainingJob,
    TrainingJobStatus,
    load_trainingjob,
)
from lifeline.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"


@pytest.fixture
def body() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_loads_with_the_documented_values():
    job = load_trainingjob(EXAMPLE)
    assert job.name == "gpt-moe"
    assert job.spec.replicas == 4
    assert job.spec.layout == LayoutSpec(tensor=1, pipeline=2, data=2, expert=1)
    assert job.spec.layout.world_size == 4
    assert job.spec.trainer_container()["command"] == ["python", "-m", "lifeline", "trainer"]
    assert job.spec.checkpoint.every == 1
    assert job.spec.checkpoint.persist is not None
    assert (job.spec.checkpoint.persist.every, job.spec.checkpoint.persist.uri) == (10, "s3://lifeline/checkpoints")
    assert job.spec.steps == 60


def test_defaults_fill_in_from_a_minimal_spec(body):
    body["spec"] = {
        "replicas": 2,
        "layout": {"data": 2},
        "steps": 5,
        "template": {"spec": {"containers": [{"name": "trainer"}]}},
    }
    spec = load_trainingjob(body).spec
    assert spec.layout == LayoutSpec(tensor=1, pipeline=1, data=2, expert=1)
    assert (spec.checkpoint.every, spec.checkpoint.peer_replicas, spec.checkpoint.keep) == (1, 1, 2)
    assert spec.checkpoint.backpressure == "wait" and spec.checkpoint.persist is None
    assert (spec.recovery.max_restarts, spec.recovery.hang_timeout_seconds) == (10, 300)
    assert spec.recovery.elastic is None and spec.recovery.node_cooldown_seconds == 600
    assert spec.seed == 0


def test_wire_form_is_camel_case_and_round_trips(body):
    job = load_trainingjob(body)
    wire = job.to_wire()
    assert wire["spec"]["checkpoint"]["peerReplicas"] == 1
    assert wire["spec"]["recovery"]["hangTimeoutSeconds"] == 300
    assert "peer_replicas" not in str(wire)
    assert TrainingJob.model_validate(wire) == job


def test_snake_case_names_are_accepted_in_python(body):
    body["spec"]["checkpoint"] = {"every": 2, "peer_replicas": 2}
    assert load_trainingjob(body).spec.checkpoint.peer_replicas == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1024, 1024), ("8Gi", 8 * 2**30), ("500M", 500 * 10**6), ("1.5Ki", 1536), ("1e3", 1000), ("0.5", 1)],
)
def test_memory_limit_takes_bytes_or_a_quantity(body, value, expected):
    body["spec"]["checkpoint"]["memoryLimit"] = value
    assert load_trainingjob(body).spec.checkpoint.memory_limit == expected


def _error(body: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_trainingjob(body)
    return info.value


def test_replicas_must_equal_the_layout_product(body):
    body["spec"]["replicas"] = 3
    err = _error(body)
    assert err.field == "spec.replicas"
    assert "1*2*2*1 = 4" in str(err) and "set replicas to 4" in str(err)
    assert err.job == "gpt-moe"


def test_persist_every_must_be_a_multiple_of_every(body):
    body["spec"]["checkpoint"]["every"] = 4
    err = _error(body)
    assert err.field == "spec.checkpoint.persist.every"
    assert "must be a multiple of spec.checkpoint.every (4)" in str(err)
    assert "use e.g. 8 or 12" in str(err)


def test_unknown_field_is_rejected_by_name(body):
    body["spec"]["checkpoint"]["persistEvery"] = 10
    err = _error(body)
    assert err.field == "spec.checkpoint.persistEvery"
    assert "unknown field spec.checkpoint.persistEvery" in str(err)


def test_missing_layout_is_rejected_by_name(body):
    del body["spec"]["layout"]
    err = _error(body)
    assert err.field == "spec.layout"
    assert "spec.layout is required" in str(err)


def test_trainer_container_must_exist(body):
    body["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    err = _error(body)
    assert err.field == "spec.template.spec.containers"
    assert "found ['main']" in str(err)


def test_elastic_min_replicas_at_most_replicas(body):
    body["spec"]["recovery"]["elastic"] = {"minReplicas": 5}
    err = _error(body)
    assert err.field == "spec.recovery.elastic.minReplicas"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("layout", "pipeline"), 0, "spec.layout.pipeline"),
        (("checkpoint", "backpressure"), "block", "spec.checkpoint.backpressure"),
        (("checkpoint", "persist", "uri"), "http://x", "spec.checkpoint.persist.uri"),
        (("checkpoint", "memoryLimit"), "8GB", "spec.checkpoint.memoryLimit"),
        (("steps",), "many", "spec.steps"),
        (("replicas",), 9_437_184, "spec.replicas"),  # the hostile spec that held the operator 70 s
        (("layout", "tensor"), 1_048_576, "spec.layout.tensor"),
    ],
)
def test_bad_values_name_the_field(body, path, value, field):
    node = body["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _error(body).field == field


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_trainingjob(bad)
    assert info.value.key == str(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_trainingjob(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_trainingjob(tmp_path / "list.yaml")


def test_wrong_kind_is_rejected(body):
    bad = copy.deepcopy(body)
    bad["kind"] = "Job"
    assert _error(bad).field == "kind"


def test_status_round_trips_with_conditions_and_recoveries(body):
    body["status"] = {
        "phase": "Recovering",
        "step": 12,
        "completeStep": 11,
        "generation": 2,
        "restarts": 1,
        "conditions": [
            {"type": "Recovering", "status": "True", "observedGeneration": 1,
             "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "NodeLost", "message": "node-2"}
        ],
        "recoveries": [
            {"generation": 2, "kind": "ReplacePods", "ranks": [3], "fromStep": 11, "tier": "L1",
             "startedAt": "2026-01-01T00:00:00Z", "resumedAt": "2026-01-01T00:00:04Z", "seconds": 4.0,
             "reason": "NODE_LOST node-2"}
        ],
    }
    job = load_trainingjob(body)
    assert isinstance(job.status, TrainingJobStatus)
    assert job.status.recoveries[0].kind is RecoveryAction.REPLACE_PODS
    assert job.status.conditions[0].observed_generation == 1
    assert TrainingJob.model_validate(job.to_wire()) == job
    body["status"]["phase"] = "Crashed"
    assert _error(body).field == "status.phase"


def test_models_are_immutable(body):
    job = load_trainingjob(body)
    with pytest.raises(ValidationError, match="frozen"):
        job.spec.replicas = 8  # type: ignore[misc]


@pytest.mark.parametrize(("uri", "ok"), [
    ("s3://lifeline/checkpoints", True), ("s3://Bad_Bucket/x", False),
    ("az://lifeline/checkpoints", True), ("az://ckpt-2", True), ("az://a--b/x", False), ("az://ab/x", False),
    ("az://-abc/x", False), ("az://" + "a" * 64, False), ("file:///tmp/l2", True), ("file://relative", False),
    ("gs://bucket/x", True), ("gs://my_bucket.v2/ckpt", True), ("gs://Bucket/x", False), ("gs://ab", False),
    ("gs://_ab/x", False), ("http://x", False),
])
def test_the_crd_pattern_and_the_uri_check_agree(uri, ok):
    """The CRD's schema (what the API server enforces) and the Python check (``lifeline validate``, the
    operator) accept and refuse the same L2 URIs, ``az://`` containers and ``gs://`` buckets included."""
    import re

    from lifeline.api._names import PERSIST_URI_PATTERN, check_persist_uri

    assert (check_persist_uri(uri) is None) is ok, check_persist_uri(uri)
    assert bool(re.fullmatch(PERSIST_URI_PATTERN.strip("^$"), uri)) is ok
