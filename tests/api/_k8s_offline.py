"""An offline stand-in for the API server's CRD validation, for tests only.

Emulates what kube-apiserver does with a structural schema, in its order: defaulting, then
OpenAPI validation (types, required, enum, bounds, pattern, unknown fields as under strict
field validation), then the CEL rules (``x-kubernetes-validations``), evaluated by a real CEL
implementation (``common-expression-language``). The real API server is exercised by
``test_cluster.py``; this lets the same cases run without one.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import cel

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill ``default`` values of absent properties, recursively (as the API server does)."""
    obj = copy.deepcopy(obj)
    _default(schema, obj)
    return obj


def _default(schema: dict[str, Any], obj: Any) -> None:
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                _default(sub, obj[name])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _default(schema["items"], item)


def validate(schema: dict[str, Any], obj: Any, old: Any = None, path: str = "") -> list[str]:
    """Errors (``"<path>: <message>"``) of ``obj`` against a structural ``schema``, after defaulting.

    ``old`` is the previous object for transition rules (rules naming ``oldSelf`` run only
    when ``old`` is given, as on an update).
    """
    obj = apply_defaults(schema, obj)
    old = apply_defaults(schema, old) if old is not None else None
    return _validate(schema, obj, old, path)


def _validate(schema: dict[str, Any], obj: Any, old: Any, path: str) -> list[str]:
    errors: list[str] = []
    where = path or "<root>"
    if path == "metadata":  # ObjectMeta: validated by the API server's own rules, not the CRD schema
        return []
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(obj, (int, str)) or isinstance(obj, bool):
            return [f"{where}: must be an integer or a string"]
    elif kind == "integer":
        if not isinstance(obj, int) or isinstance(obj, bool):
            return [f"{where}: must be an integer"]
    elif kind == "number":
        if not isinstance(obj, (int, float)) or isinstance(obj, bool):
            return [f"{where}: must be a number"]
    elif kind in _TYPES and not isinstance(obj, _TYPES[kind]):
        return [f"{where}: must be of type {kind}"]
    if "enum" in schema and obj not in schema["enum"]:
        errors.append(f"{where}: Unsupported value {obj!r}: supported values: {schema['enum']}")
    if "minimum" in schema and isinstance(obj, (int, float)) and obj < schema["minimum"]:
        errors.append(f"{where}: should be greater than or equal to {schema['minimum']}")
    if "pattern" in schema and isinstance(obj, str) and not re.search(schema["pattern"], obj):
        errors.append(f"{where}: should match {schema['pattern']!r}")
    if isinstance(obj, list):
        if "minItems" in schema and len(obj) < schema["minItems"]:
            errors.append(f"{where}: should have at least {schema['minItems']} items")
        if "maxItems" in schema and len(obj) > schema["maxItems"]:
            errors.append(f"{where}: should have at most {schema['maxItems']} items")
        for i, item in enumerate(obj):
            errors += _validate(schema.get("items", {}), item, None, f"{path}[{i}]")
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in obj:
                errors.append(f"{_join(path, name)}: Required value")
        for name, value in obj.items():
            if name in props:
                sub_old = old.get(name) if isinstance(old, dict) else None
                errors += _validate(props[name], value, sub_old, _join(path, name))
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f'unknown field "{_join(path, name)}"')
    if not errors:
        errors += _cel(schema, obj, old, where)
    return errors


def _cel(schema: dict[str, Any], obj: Any, old: Any, where: str) -> list[str]:
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        ctx = {"self": obj, "oldSelf": old} if transition else {"self": obj}
        if cel.evaluate(rule["rule"], ctx) is not True:
            if "messageExpression" in rule:
                message = cel.evaluate(rule["messageExpression"], ctx)
            else:
                message = rule.get("message", f"failed rule: {rule['rule']}")
            errors.append(f"{where}{rule.get('fieldPath', '')}: Invalid value: {message}")
    return errors


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def structural_problems(schema: dict[str, Any], path: str = "") -> list[str]:
    """Violations of the Kubernetes structural-schema rules, empty when ``schema`` is structural."""
    problems = []
    where = path or "<root>"
    for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title"):
        if key in schema:
            problems.append(f"{where}: {key} is not allowed")
    opaque = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string")
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{where}: type is missing")
    if "additionalProperties" in schema:
        if schema["additionalProperties"] is False:
            problems.append(f"{where}: additionalProperties: false is forbidden")
        if "properties" in schema:
            problems.append(f"{where}: additionalProperties beside properties")
    if "default" in schema and schema["default"] is None:
        problems.append(f"{where}: default null on a non-nullable field")
    if schema.get("type") == "object" and "properties" not in schema and not opaque and path != ".metadata":
        problems.append(f"{where}: object with neither properties nor preserve-unknown-fields")
    for name, sub in schema.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}")
    if "items" in schema:
        problems += structural_problems(schema["items"], f"{path}[]")
    return problems
