"""The generated CRD on a real kube-apiserver (the dev cluster): the example is accepted with
defaults applied, invalid jobs are rejected with messages naming the field, the layout is
immutable unless elastic, and kubectl shows the printer columns."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from lifeline.api import load_trainingjob
from lifeline.api.crd import CRD_NAME, CRD_PATH, build_crd
from lifeline.errors import ClusterError

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"


@pytest.fixture(scope="module")
def crd(devcluster):
    """The TrainingJob CRD, Established. Applied (and deleted afterwards) unless already there,
    e.g. installed by the chart in an earlier test, in which case it is left as found."""
    existing = devcluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").strip()
    if not existing:
        devcluster.kubectl("apply", "--server-side", "--field-manager=lifeline-test", "-f", str(ROOT / CRD_PATH))
    devcluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    served = json.loads(devcluster.kubectl("get", "crd", CRD_NAME, "-o", "json"))
    assert served["spec"]["versions"][0]["schema"] == build_crd()["spec"]["versions"][0]["schema"]
    yield CRD_NAME
    if not existing:
        devcluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s")


def _apply(devcluster, namespace: str, body: dict) -> str:
    return devcluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def _rejected(devcluster, namespace: str, body: dict) -> str:
    with pytest.raises(ClusterError) as info:
        _apply(devcluster, namespace, body)
    return str(info.value)


@pytest.fixture
def body() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _cells(table: str) -> dict[str, str]:
    """The one row of ``kubectl get`` output, by column: each cell read at its header's offset."""
    header, row = table.splitlines()[:2]
    names = header.split()
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], len(row)]
    return {name: row[start:end].strip() for name, start, end in zip(names, starts, ends)}


def test_example_is_accepted_and_defaulted(devcluster, crd, namespace):
    devcluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    stored = json.loads(devcluster.kubectl("get", "trainingjob", "gpt-moe", "-n", namespace, "-o", "json"))
    assert stored["spec"]["layout"] == {"tensor": 1, "pipeline": 2, "data": 2, "expert": 1}
    assert stored["spec"]["recovery"]["localizedReplay"] is False  # a default filled by the API server
    assert stored["spec"]["checkpoint"]["persist"] == {"every": 10, "uri": "s3://lifeline/checkpoints"}
    job = load_trainingjob(stored)  # what the API server stores, the Python models read
    assert job.spec == load_trainingjob(EXAMPLE).spec
    table = devcluster.kubectl("get", "tj", "-n", namespace)
    assert table.split()[:8] == ["NAME", "PHASE", "STEP", "COMPLETE", "RESTARTS", "RECOVERY", "STRAGGLERS", "AGE"]
    assert "gpt-moe" in table
    # the rung of the latest recovery and the rank flagged last show in their columns
    record = {"generation": 1, "kind": "LocalizedReplay", "startedAt": "2026-01-01T00:00:00Z"}
    flagged = {"generation": 1, "relative": 2.0, "individual": 2.0, "computeSeconds": 0.2, "steps": [3, 12]}
    devcluster.kubectl("patch", "trainingjob", "gpt-moe", "-n", namespace, "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": {
                           "phase": "Running", "recoveries": [{**record, "kind": "RestartInPlace", "generation": 0}, record],
                           "stragglers": [{**flagged, "rank": 1}, {**flagged, "rank": 3}]}}))
    cells = _cells(devcluster.kubectl("get", "tj", "gpt-moe", "-n", namespace))
    assert cells["RECOVERY"] == "LocalizedReplay", cells  # the newest record
    assert cells["STRAGGLERS"] == "3", cells  # the rank flagged last


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s.__setitem__("replicas", 3), ["spec.replicas", "must equal the product"]),
        (lambda s: s["checkpoint"].__setitem__("every", 3), ["spec.checkpoint.persist.every", "multiple"]),
        (lambda s: s["checkpoint"].__setitem__("persistEvery", 10), ['unknown field "spec.checkpoint.persistEvery"']),
        (lambda s: s.pop("layout"), ["spec.layout", "Required value"]),
        (lambda s: s["template"]["spec"]["containers"][0].__setitem__("name", "main"),
         ["spec.template.spec.containers", "'trainer'"]),
        (lambda s: s.update(replicas=9_437_184, layout={"tensor": 1_048_576, "pipeline": 3, "data": 1, "expert": 3}),
         ["spec.replicas", "131072", "spec.layout.tensor"]),
    ],
    ids=["replicas-not-product", "persist-not-multiple", "unknown-field", "missing-layout", "no-trainer",
         "world-too-large"],
)
def test_invalid_jobs_are_rejected_naming_the_field(devcluster, crd, namespace, body, mutate, expected):
    bad = copy.deepcopy(body)
    mutate(bad["spec"])
    message = _rejected(devcluster, namespace, bad)
    for text in expected:
        assert text in message, message
    assert devcluster.kubectl("get", "tj", "-n", namespace, "-o", "name").strip() == ""


@pytest.mark.parametrize(("name", "expected"), [("a" * 64, "at most 63 characters"), ("My_Job", "RFC 1123")],
                         ids=["too-long", "not-rfc1123"])
def test_job_names_are_kubernetes_names(devcluster, crd, namespace, body, name, expected):
    bad = copy.deepcopy(body)
    bad["metadata"]["name"] = name
    message = _rejected(devcluster, namespace, bad)
    assert expected in message and "metadata.name" in message, message
    assert devcluster.kubectl("get", "tj", "-n", namespace, "-o", "name").strip() == ""


def test_layout_is_immutable_unless_elastic(devcluster, crd, namespace, body):
    del body["spec"]["recovery"]["elastic"]
    _apply(devcluster, namespace, body)
    reshaped = copy.deepcopy(body)
    reshaped["spec"].update(replicas=2, layout={"tensor": 1, "pipeline": 2, "data": 1, "expert": 1})
    assert "spec.layout is immutable" in _rejected(devcluster, namespace, reshaped)
    longer = copy.deepcopy(body)
    longer["spec"]["steps"] = 90
    _apply(devcluster, namespace, longer)
    elastic = copy.deepcopy(longer)
    elastic["spec"].update(replicas=2, layout={"tensor": 1, "pipeline": 2, "data": 1, "expert": 1})
    elastic["spec"]["recovery"]["elastic"] = {"minReplicas": 2}
    _apply(devcluster, namespace, elastic)  # setting elastic allows the reshape
    stored = json.loads(devcluster.kubectl("get", "tj", "gpt-moe", "-n", namespace, "-o", "json"))
    assert (stored["spec"]["replicas"], stored["spec"]["layout"]["data"], stored["spec"]["steps"]) == (2, 1, 90)


def test_status_subresource_accepts_operator_status(devcluster, crd, namespace, body):
    _apply(devcluster, namespace, body)
    status = {"status": {"phase": "Running", "step": 7, "completeStep": 6, "generation": 1, "restarts": 0}}
    devcluster.kubectl("patch", "tj", "gpt-moe", "-n", namespace, "--subresource=status", "--type=merge",
                       "-p", json.dumps(status))
    row = devcluster.kubectl("get", "tj", "gpt-moe", "-n", namespace, "--no-headers").split()
    assert row[1:5] == ["Running", "7", "6", "0"]
    stored = json.loads(devcluster.kubectl("get", "tj", "gpt-moe", "-n", namespace, "-o", "json"))
    assert load_trainingjob(stored).status.step == 7


@pytest.mark.parametrize("keep", [True, False])
def test_helm_renders_the_crd_template(devcluster, keep):
    out = devcluster.helm("template", "lifeline", str(ROOT / "helm" / "lifeline"),
                          "--show-only", "templates/crds/trainingjobs.yaml", "--set", f"crds.keep={str(keep).lower()}")
    rendered = yaml.safe_load(out)
    annotations = rendered["metadata"].pop("annotations", None)
    assert annotations == ({"helm.sh/resource-policy": "keep"} if keep else None)
    assert rendered == build_crd()
    with pytest.raises(ClusterError, match="crds"):  # values.schema.json rejects a non-boolean switch
        devcluster.helm("template", "lifeline", str(ROOT / "helm" / "lifeline"), "--set", "crds.enabled=maybe")
