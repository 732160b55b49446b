"""The generated CRD: structural, in sync with the committed files, and enforcing the same
rules as the Python models (checked offline here; against a real API server in test_api_cluster.py)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _k8s_offline import structural_problems, validate
from lifeline.api import load_trainingjob
from lifeline.api.crd import CRD_PATH, HELM_CRD_PATH, build_crd, check, main, render_crd, render_helm_crd, write
from lifeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt-moe.yaml"


@pytest.fixture(scope="module")
def schema() -> dict:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture
def body() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_committed_files_match_build_crd():
    assert check(ROOT) == [], "run: python -m lifeline.api.crd --write"
    assert yaml.safe_load((ROOT / CRD_PATH).read_text()) == build_crd()


def test_check_reports_drift_and_write_fixes_it(tmp_path):
    assert sorted(check(tmp_path)) == sorted([tmp_path / CRD_PATH, tmp_path / HELM_CRD_PATH])
    write(tmp_path)
    assert check(tmp_path) == []
    (tmp_path / CRD_PATH).write_text(render_crd().replace("tj", "tjx"))
    assert check(tmp_path) == [tmp_path / CRD_PATH]
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "lifeline.api.crd", "--check", "--root", str(ROOT)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_schema_is_structural(schema):
    assert structural_problems(schema) == []


def test_structural_checker_catches_violations():
    assert structural_problems({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}})
    assert structural_problems({"type": "object", "properties": {"a": {"$ref": "#/x"}}})
    assert structural_problems({"type": "object", "properties": {"a": {"type": "string", "default": None}}})


def test_crd_metadata():
    crd = build_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "trainingjobs.lifeline.dev"
    assert spec["names"]["shortNames"] == ["tj"] and "lifeline" in spec["names"]["categories"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert columns == ["Phase", "Step", "Complete", "Restarts", "Recovery", "Stragglers", "Age"]


def test_schema_keeps_defaults_and_descriptions(schema):
    checkpoint = schema["properties"]["spec"]["properties"]["checkpoint"]
    assert checkpoint["default"] == {}
    assert checkpoint["properties"]["every"]["default"] == 1
    assert "in-memory" in checkpoint["properties"]["every"]["description"]
    assert checkpoint["properties"]["memoryLimit"] == {
        "description": checkpoint["properties"]["memoryLimit"]["description"],
        "x-kubernetes-int-or-string": True,
    }
    assert "``" not in yaml.safe_dump(schema)


def test_example_is_accepted_offline(schema, body):
    assert validate(schema, body) == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s.__setitem__("replicas", 3), r"spec\.replicas: .*spec\.replicas must equal the product"),
        (lambda s: s["checkpoint"].__setitem__("every", 3),
         r"spec\.checkpoint\.persist\.every: .*persist\.every must be a multiple"),
        (lambda s: s["checkpoint"].__setitem__("persistEvery", 10), r'unknown field "spec\.checkpoint\.persistEvery"'),
        (lambda s: s.pop("layout"), r"spec\.layout: Required value"),
        (lambda s: s["template"]["spec"]["containers"][0].__setitem__("name", "main"),
         r"containers: Invalid value: .*named 'trainer'"),
        (lambda s: s["recovery"]["elastic"].__setitem__("minReplicas", 8),
         r"spec\.recovery\.elastic\.minReplicas: .*must be <= spec\.replicas"),
        (lambda s: s["layout"].__setitem__("data", 0), r"spec\.layout\.data: should be greater than or equal to 1"),
        (lambda s: s["template"]["spec"]["containers"][0].__setitem__("env", {"FOO": {"nested": "bar"}}),
         r"spec\.template\.spec\.containers\[0\]\.env: .*must be of type array"),
        (lambda s: s["template"]["spec"]["containers"][0].__setitem__("env", [{"value": "x"}]),
         r"spec\.template\.spec\.containers\[0\]\.env\[0\]\.name: Required value"),
        (lambda s: s["template"]["spec"].__setitem__("volumes", "scratch"),
         r"spec\.template\.spec\.volumes: .*must be of type array"),
        (lambda s: s["template"].__setitem__("metadata", {"labels": ["a"]}),
         r"spec\.template\.metadata\.labels: .*must be of type object"),
    ],
)
def test_invalid_jobs_are_rejected_offline_as_in_python(schema, body, mutate, expected):
    bad = copy.deepcopy(body)
    mutate(bad["spec"])
    errors = validate(schema, bad)
    assert any(re.search(expected, e) for e in errors), errors
    with pytest.raises(ConfigError):  # the Python models agree
        load_trainingjob(bad)


def test_layout_is_immutable_unless_elastic(schema, body):
    fixed = copy.deepcopy(body)
    del fixed["spec"]["recovery"]["elastic"]
    reshaped = copy.deepcopy(fixed)
    reshaped["spec"].update(replicas=2, layout={"pipeline": 2, "data": 1})
    errors = validate(schema, reshaped, old=fixed)
    assert any("spec.layout: Invalid value: spec.layout is immutable" in e for e in errors), errors
    steps_changed = copy.deepcopy(fixed)
    steps_changed["spec"]["steps"] = 90
    assert validate(schema, steps_changed, old=fixed) == []
    elastic = copy.deepcopy(body)
    elastic_reshaped = copy.deepcopy(elastic)
    elastic_reshaped["spec"].update(replicas=2, layout={"pipeline": 2, "data": 1})
    assert validate(schema, elastic_reshaped, old=elastic) == []


def _render(template: str, values: dict) -> str:
    """Render the two constructs the CRD template uses: ``{{- if .Values.a.b }}`` and ``{{- end }}``
    (with Go template whitespace trimming), the way helm would."""
    tokens = re.split(r"(\s*\{\{-\s*(?:if \.Values\.[\w.]+|end)\s*\}\})", template)
    out, stack = [], [True]
    for token in tokens:
        action = re.fullmatch(r"\s*\{\{-\s*(if \.Values\.([\w.]+)|end)\s*\}\}", token)
        if action is None:
            if all(stack):
                out.append(token)
            continue
        if action.group(1) == "end":
            stack.pop()
        else:
            node = values
            for key in action.group(2).split("."):
                node = node[key]
            stack.append(bool(node))
    assert stack == [True], "unbalanced if/end"
    return "".join(out)


def test_helm_template_wraps_the_same_crd():
    text = render_helm_crd()
    assert (ROOT / HELM_CRD_PATH).read_text() == text
    kept = yaml.safe_load(_render(text, {"crds": {"enabled": True, "keep": True}}))
    assert kept["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    del kept["metadata"]["annotations"]
    assert kept == build_crd()
    assert yaml.safe_load(_render(text, {"crds": {"enabled": True, "keep": False}})) == build_crd()
    assert yaml.safe_load(_render(text, {"crds": {"enabled": False, "keep": True}})) is None


def test_chart_values_declare_crd_switches():
    values = yaml.safe_load((ROOT / "helm" / "lifeline" / "values.yaml").read_text())
    assert values["crds"] == {"enabled": True, "keep": True}
    chart = yaml.safe_load((ROOT / "helm" / "lifeline" / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "lifeline"
