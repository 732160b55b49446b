"""The CRD schema of ``spec.template`` (a PodTemplateSpec): open, with the fields the operator
reads or merges into typed.

Why typed at all: the operator merges its own env, volume mounts and volumes into the template
and reads its labels; a template where such a field has the wrong shape (``env`` a map, ``volumes``
a string) would break the pod manifest. The API server now refuses it naming the field. Everything
else of a pod is the API server's pod validation at pod creation (a refused pod marks the job
Failed: :func:`lifeline.operator.spec.pod_refused`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRAINER_CONTAINER", "TEMPLATE_SCHEMA", "template_problems"]

TRAINER_CONTAINER = "trainer"
"""The name of the training container in ``spec.template.spec.containers``."""

# The pod template stays open (any PodTemplateSpec field is kept as written), but the fields the
# operator reads or merges its own entries into are typed, so a hostile template is refused by the
# API server naming the field instead of breaking the pod manifest: containers[].name (the trainer
# container must exist), env (a list of {name, value}), volumeMounts, command/args, image,
# volumes, affinity, the template's labels/annotations. The kubelet-level checks stay the pod's:
# a pod the API server refuses at creation marks the job Failed (lifeline.operator.spec).
_OPEN_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}


def _named_list(max_items: int, **properties: Any) -> dict[str, Any]:
    """A list of open objects, each with a required string ``name`` (plus typed ``properties``)."""
    return {
        "type": "array",
        "maxItems": max_items,
        "items": {
            **_OPEN_OBJECT,
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 253}, **properties},
        },
    }


_CONTAINER_SCHEMA: dict[str, Any] = {
    **_OPEN_OBJECT,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 63},
        "image": {"type": "string"},
        "command": _STRINGS,
        "args": _STRINGS,
        "env": _named_list(1024, value={"type": "string"}, valueFrom=_OPEN_OBJECT),
        "volumeMounts": _named_list(256, mountPath={"type": "string", "minLength": 1}),
        "resources": _OPEN_OBJECT,
    },
}
TEMPLATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "required": ["spec"],
    "properties": {
        "metadata": {**_OPEN_OBJECT, "properties": {"labels": _OPEN_OBJECT, "annotations": _OPEN_OBJECT}},
        "spec": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 64,
                    "items": _CONTAINER_SCHEMA,
                    "x-kubernetes-validations": [
                        {
                            "rule": f"self.exists(c, c.name == '{TRAINER_CONTAINER}')",
                            "message": f"spec.template.spec.containers must include a container named "
                            f"'{TRAINER_CONTAINER}' (the training process)",
                            "reason": "FieldValueRequired",
                        }
                    ],
                },
                "volumes": _named_list(256),
                "affinity": _OPEN_OBJECT,
                "nodeSelector": _OPEN_OBJECT,
            },
        },
    },
}


_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,)}


def template_problems(template: Any, schema: dict[str, Any] = TEMPLATE_SCHEMA,
                      path: str = "spec.template") -> list[tuple[str, str]]:
    """Check ``template`` against the typed part of :data:`TEMPLATE_SCHEMA` (types, required keys,
    ``minLength``), so the Python models refuse what the API server refuses.

    Returns:
        ``(field path, problem)`` of every mismatch, e.g.
        ``("spec.template.spec.containers[0].env", "must be a list (got dict)")``; empty when none.
    """
    expected = _TYPES.get(schema.get("type", ""))
    if expected is not None and not isinstance(template, expected):
        noun = {"object": "an object", "array": "a list", "string": "a string"}[schema["type"]]
        return [(path, f"{path} must be {noun} (got {type(template).__name__})")]
    out: list[tuple[str, str]] = []
    if isinstance(template, str) and len(template) < schema.get("minLength", 0):
        out.append((path, f"{path} must not be empty"))
    if isinstance(template, dict):
        for key in schema.get("required", []):
            if key not in template:
                out.append((f"{path}.{key}", f"{path}.{key} is required"))
        for key, sub in (schema.get("properties") or {}).items():
            if key in template and template[key] is not None:
                out += template_problems(template[key], sub, f"{path}.{key}")
    if isinstance(template, list) and "items" in schema:
        for i, item in enumerate(template):
            out += template_problems(item, schema["items"], f"{path}[{i}]")
    return out
