"""Turn a pydantic JSON schema into a Kubernetes *structural* OpenAPI v3 schema.

Kubernetes accepts only structural schemas for CRDs
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):
every node names its ``type`` (unless it is ``x-kubernetes-int-or-string`` or preserves
unknown fields), no ``$ref``, no ``anyOf``/``oneOf``/``allOf`` carrying types, and
``additionalProperties`` never beside ``properties``. The conversion:

- ``$ref`` (with pydantic's sibling keys or ``allOf: [ref]``) is inlined; the field's
  description wins over the class docstring;
- ``anyOf: [X, {type: null}]`` (an ``Optional``) becomes ``X``. The API server prunes
  ``null`` from fields not marked ``nullable`` before validation, so ``persist: null`` reads
  as "unset" exactly as Python's ``None`` default does; no field is emitted ``nullable``;
- ``additionalProperties: true`` (a free-form mapping) becomes
  ``x-kubernetes-preserve-unknown-fields: true``; ``additionalProperties: false`` (from
  ``extra="forbid"``) is dropped: the API server rejects unknown fields under strict field
  validation (kubectl's default) and prunes them otherwise;
- JSON Schema 2020-12 numeric ``exclusiveMinimum: n`` becomes OpenAPI 3.0's
  ``minimum: n, exclusiveMinimum: true``; ``const`` becomes a one-value ``enum``;
- ``title`` and ``default: null`` are dropped; ``description``, ``default``, ``enum``, bounds, ``pattern``,
  ``format`` and ``x-kubernetes-*`` keys are kept.
"""

from __future__ import annotations

import copy
import re
from typing import Any

__all__ = ["structural"]

# Kept keys, in the order they are written out.
_KEEP = (
    "type", "description", "default", "enum", "format", "pattern", "minimum", "exclusiveMinimum",
    "maximum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
    "nullable", "required", "properties", "items",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
    "x-kubernetes-validations",
)


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Return the structural form of a pydantic ``model_json_schema()`` (input left unchanged).

    Raises:
        ValueError: a construct that has no structural form (a union of two non-null types
            other than int-or-string, or a ``$ref`` to a missing definition).
    """
    defs = schema.get("$defs", {})
    return _convert(schema, defs)


def _plain(text: str) -> str:
    """Docstring markup to plain text for ``kubectl explain``: ``x`` and :role:`x` become x."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref`` / ``allOf: [{$ref}]``; sibling keys override the referenced schema."""
    node = dict(node)
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        if name not in defs:
            raise ValueError(f"$ref to unknown definition {name!r}")
        target = _resolve(defs[name], defs)
        node = {**target, **node}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    for union in ("anyOf", "oneOf"):
        if union in node:
            options = [o for o in node.pop(union) if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"{union} of {len(options)} non-null types has no structural form: {options}")
            inner = _resolve(options[0], defs)
            node = {**inner, **node}
            node = _resolve(node, defs)
    out: dict[str, Any] = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    extra = node.get("additionalProperties")
    if extra is True or isinstance(extra, dict) and not extra:
        out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict):
        raise ValueError("typed additionalProperties (a map of models) is not used by TrainingJob")
    for key, value in node.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "description":
            out[key] = _plain(value)
        elif key in ("default", "x-kubernetes-validations", "enum"):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = value
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        out["minimum"] = node["exclusiveMinimum"]
        out["exclusiveMinimum"] = True
    if isinstance(node.get("exclusiveMaximum"), (int, float)) and not isinstance(node["exclusiveMaximum"], bool):
        out["maximum"] = node["exclusiveMaximum"]
        out["exclusiveMaximum"] = True
    if "enum" in out and "type" not in out:
        kinds = {type(v) for v in out["enum"]}
        out["type"] = "string" if kinds == {str} else "integer" if kinds == {int} else out.get("type")
    if "required" in out and not out["required"]:
        del out["required"]
    if "default" in out and out["default"] is None:
        del out["default"]
    return {key: out[key] for key in _KEEP if key in out}
