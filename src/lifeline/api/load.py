"""Load and validate a TrainingJob from YAML or a dict, with errors that name the field."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lifeline.api.trainingjob import TrainingJob
from lifeline.errors import ConfigError

__all__ = ["load_trainingjob", "field_path"]

_FIXES = {
    "extra_forbidden": "remove it or check its spelling (fields are camelCase)",
    "missing": "add it",
    "greater_than_equal": "use a larger value",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "fix its format",
    "model_type": "write a mapping",
    "dict_type": "write a mapping",
}


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted wire path, e.g. ``spec.checkpoint.persist.every``.

    List indices render as ``[i]`` (``status.conditions[0].type``).
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def load_trainingjob(source: str | os.PathLike[str] | Mapping[str, Any]) -> TrainingJob:
    """Parse and validate one TrainingJob.

    Args:
        source: a path to a YAML (or JSON) file holding one TrainingJob object, or the object
            as a mapping (e.g. a kopf body or ``yaml.safe_load`` output).

    Returns:
        The validated :class:`TrainingJob` (defaults filled in).

    Raises:
        ConfigError: the file is missing or not YAML, or the object is invalid; ``field``
            names the offending wire path (``spec.replicas``, ``spec.checkpoint.foo``) and the
            message says how to fix it. Only the first problem is reported in ``field``; the
            message lists them all.
    """
    where = None
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        where = str(source)
        try:
            text = Path(source).read_text()
        except OSError as err:
            raise ConfigError(f"cannot read TrainingJob file {where}: {err.strerror}", key=where) from err
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{where} is not valid YAML: {err}", key=where) from err
    if not isinstance(data, dict):
        raise ConfigError(
            f"a TrainingJob must be a mapping with apiVersion, kind, metadata and spec, got {type(data).__name__}",
            key=where,
        )
    job = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) else None
    try:
        return TrainingJob.model_validate(data)
    except ConfigError as err:
        if err.job is None and job is not None:
            err.job = job
        raise
    except ValidationError as err:
        problems = []
        for e in err.errors():
            path = field_path(e["loc"])
            fix = _FIXES.get(e["type"], "")
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown field {path}: {fix}")
            elif e["type"] == "missing":
                problems.append(f"{path} is required: {fix}")
            else:
                problems.append(f"{path}: {e['msg']}" + (f"; {fix}" if fix else ""))
        first = field_path(err.errors()[0]["loc"])
        raise ConfigError("invalid TrainingJob: " + "; ".join(problems), field=first, job=job, key=where) from None
