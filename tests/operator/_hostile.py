"""Hypothesis strategies of hostile TrainingJob documents (issue 15, "Hostile specs").

A hostile document is the valid example (examples/gpt-moe.yaml) with 1 to 3 mutations, each one of:

* ``replace``: a field (any field the CRD schema knows, down to list items, plus pod fields the
  CRD leaves open: ports, resources, tolerations...) set to a hostile value: a wrong type, an
  out-of-range or huge number, a negative or malformed quantity, an empty, huge (up to 200 000
  characters) or unicode string (right-to-left marks, zero-width joiners, NUL, astral planes), a
  list or a nested object where a scalar belongs;
* ``delete``: a field removed;
* ``add``: an unknown field added to an object;
* ``layout``: a wrong layout (degrees 0, negative or huge; replicas equal to their product or not);
* ``annotate``: one of the operator's own record annotations (``lifeline.dev/plan`` and the
  others of :mod:`lifeline.operator.recorded`) set to a hostile JSON text — anyone who can edit
  the job can write them.

Every pod of the base is pinned to a scheduler that does not exist (``schedulerName``), a path the
mutations leave alone: the pods of a job the fuzz leaves valid stay Pending, so no trainer runs.
Mutations are plain data (``(op, path, value)`` tuples), so a failing example prints as something
that can be replayed with :func:`apply_mutations`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from lifeline.api.crd import build_crd

__all__ = ["EXAMPLE", "UNSCHEDULED", "base_job", "schema_paths", "hostile_values", "mutations", "apply_mutations",
           "Mutation"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
UNSCHEDULED = "lifeline-fuzz-no-scheduler"
"""``schedulerName`` of every fuzzed pod: no scheduler serves it, so the pods stay Pending."""

Path_ = tuple[str | int, ...]
Mutation = tuple[str, Path_, Any]
"""``(op, path under spec (or an annotation key for annotate), value)``."""

# Pod fields the CRD leaves to the API server's pod validation (paths under spec.template.spec).
_POD_PATHS: list[Path_] = [
    ("containers", 0, "ports"),
    ("containers", 0, "ports", 0, "containerPort"),
    ("containers", 0, "resources", "requests"),
    ("containers", 0, "resources", "requests", "cpu"),
    ("containers", 0, "resources", "limits", "memory"),
    ("containers", 0, "imagePullPolicy"),
    ("containers", 0, "workingDir"),
    ("containers", 0, "securityContext"),
    ("containers", 0, "env", 0, "valueFrom", "fieldRef"),
    ("containers", 1),
    ("tolerations",),
    ("serviceAccountName",),
    ("terminationGracePeriodSeconds",),
    ("priority",),
    ("hostname",),
    ("dnsPolicy",),
    ("volumes", 0, "emptyDir"),
    ("initContainers",),
]
_PINNED = ("template", "spec", "schedulerName")

RECORD_ANNOTATIONS = ["lifeline.dev/generation", "lifeline.dev/plan", "lifeline.dev/applied",
                      "lifeline.dev/handled", "lifeline.dev/cool-downs"]


def base_job(name: str) -> dict[str, Any]:
    """The example job named ``name``, its pods pinned to :data:`UNSCHEDULED`."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name}
    body["spec"]["template"]["spec"]["schedulerName"] = UNSCHEDULED
    return body


def schema_paths() -> list[Path_]:
    """Every path under ``spec`` the CRD schema names (list items as index 0), plus :data:`_POD_PATHS`,
    less the scheduler pin."""
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    out: list[Path_] = []

    def walk(node: dict[str, Any], path: Path_) -> None:
        if path:
            out.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, path + (key,))
        if "items" in node:
            walk(node["items"], path + (0,))

    walk(root, ())
    out += [("template", "spec") + p for p in _POD_PATHS]
    return [p for p in out if p[: len(_PINNED)] != _PINNED]


_EDGE_INTS = [0, -1, 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, -(2**63), 10**30]
_EDGE_STRINGS = ["", " ", "-1", "-1Gi", "8Zi", "1e400", "0x10", "NaN", "null", "true", "1.5", "∞",
                 "\u202etrainer", "train\u200der", "\x00", "🤖" * 8, "𝔱𝔯𝔞𝔦𝔫𝔢𝔯", "a" * 64, "../../etc/passwd",
                 "${LIFELINE_SECRET}", "s3://", "file:///", "s3://b/" + "p" * 300, "trainer\n", "Trainer"]

_scalars = st.one_of(
    st.sampled_from(_EDGE_INTS),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.sampled_from(_EDGE_STRINGS),
    st.text(max_size=40),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "𝔸", "\u200b"]), st.integers(1_000, 200_000)),
)


def hostile_values() -> st.SearchStrategy[Any]:
    """A hostile JSON value: a scalar of :data:`_scalars`, or lists and objects (nested up to
    about four levels) of them. ``None`` is left out: the API server prunes nulls (= unset)."""
    return st.recursive(
        _scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(st.text(min_size=1, max_size=12), inner, max_size=4)),
        max_leaves=8,
    )


_ANNOTATION_TEXTS = st.one_of(
    st.sampled_from(['"abc"', "[1]", "{}", "[]", "-5", "1e999", "{\"0\": 1}", "{\"pod\": {\"c\": \"x\"}}",
                     "{\"n\": \"soon\"}", "not json", "", "null", "{\"generation\": 1}"]),
    hostile_values().map(json.dumps),
)


@st.composite
def _mutation(draw: st.DrawFn, paths: list[Path_]) -> Mutation:
    op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "layout", "annotate"]))
    if op == "layout":
        degrees = {k: draw(st.sampled_from([0, -1, 1, 2, 3, 2**20, 2**62])) for k in
                   ("tensor", "pipeline", "data", "expert")}
        product = degrees["tensor"] * degrees["pipeline"] * degrees["data"] * degrees["expert"]
        replicas = product if draw(st.booleans()) else draw(st.sampled_from([product + 1, 0, -4, 4]))
        return ("layout", ("layout",), {"degrees": degrees, "replicas": replicas})
    if op == "annotate":
        return ("annotate", (draw(st.sampled_from(RECORD_ANNOTATIONS)),), draw(_ANNOTATION_TEXTS))
    path = draw(st.sampled_from(paths))
    if op == "delete":
        return ("delete", path, None)
    if op == "add":
        key = draw(st.one_of(st.sampled_from(["persistEvery", "Replicas", "status", "$ref", "kind", ""]),
                             st.text(min_size=1, max_size=20)))
        return ("add", path + (key,), draw(hostile_values()))
    return ("replace", path, draw(hostile_values()))


def mutations() -> st.SearchStrategy[list[Mutation]]:
    """1 to 3 mutations of the base job."""
    return st.lists(_mutation(schema_paths()), min_size=1, max_size=3)


def _set(root: Any, path: Path_, value: Any) -> None:
    """Set ``path`` in ``root``, creating objects on the way; a list index past the end appends;
    a scalar on the way is replaced by an object (or a list) so the path exists."""
    node = root
    for i, key in enumerate(path[:-1]):
        nxt = path[i + 1]
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(node, list):
            if not isinstance(key, int) or key >= len(node):
                node.append(empty)
                key = len(node) - 1
            if not isinstance(node[key], (dict, list)):
                node[key] = empty
        else:
            if not isinstance(node.get(key), (dict, list)):
                node[key] = empty
        node = node[key]
    last = path[-1]
    if isinstance(node, list):
        if isinstance(last, int) and last < len(node):
            node[last] = value
        else:
            node.append(value)
    else:
        node[last] = value


def _delete(root: Any, path: Path_) -> None:
    node = root
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return
    try:
        del node[path[-1]]
    except (KeyError, IndexError, TypeError):
        pass


def apply_mutations(body: dict[str, Any], muts: list[Mutation]) -> dict[str, Any]:
    """A copy of ``body`` with ``muts`` applied in order (paths are under ``spec``)."""
    out = copy.deepcopy(body)
    spec = out["spec"]
    for op, path, value in muts:
        if op == "replace" or op == "add":
            _set(spec, path, copy.deepcopy(value))
        elif op == "delete":
            _delete(spec, path)
        elif op == "layout":
            spec["layout"] = dict(value["degrees"])
            spec["replicas"] = value["replicas"]
        elif op == "annotate":
            out["metadata"].setdefault("annotations", {})[path[0]] = value
        else:
            raise ValueError(f"unknown mutation {op!r}")
    return out
