"""Load and validate a TrainingJob from YAML or a dict, with errors that name the field."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lifeline.api._base import FIELD_ERROR
from lifeline.api.trainingjob import API_VERSION, KIND, TrainingJob
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


def _problems(err: ValidationError) -> list[tuple[str, str]]:
    """``(field, problem)`` of every error pydantic collected, in its order."""
    out = []
    for e in err.errors():
        if e["type"] == FIELD_ERROR:
            out.append((e["ctx"]["field"], e["msg"]))
            continue
        path = field_path(e["loc"])
        fix = _FIXES.get(e["type"], "")
        if e["type"] == "extra_forbidden":
            out.append((path, f"unknown field {path}: {fix}"))
        elif e["type"] == "missing":
            out.append((path, f"{path} is required: {fix}"))
        else:
            out.append((path, f"{path}: {e['msg']}" + (f"; {fix}" if fix else "")))
    return out


def _read(where: str) -> Any:
    """The YAML document of file ``where``; a :class:`ConfigError` naming the file when it cannot be read."""
    try:
        raw = Path(where).read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read TrainingJob file {where}: {err.strerror}", key=where) from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not a text file (not UTF-8): give a TrainingJob YAML file",
                          key=where) from None
    if not text.strip():
        raise ConfigError(f"{where} is empty: write a TrainingJob (apiVersion, kind, metadata, spec)", key=where)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{where} is not valid YAML: {at}{what}", key=where) from None


def load_trainingjob(source: str | os.PathLike[str] | Mapping[str, Any]) -> TrainingJob:
    """Parse and validate one TrainingJob.

    Args:
        source: a path to a YAML (or JSON) file holding one TrainingJob object, or the object
            as a mapping (e.g. a kopf body or ``yaml.safe_load`` output).

    Returns:
        The validated :class:`TrainingJob` (defaults filled in).

    Raises:
        ConfigError: the file is missing, empty, binary or not YAML, or the object is invalid
            (``apiVersion`` and ``kind`` are required, as ``kubectl`` requires them). One error
            lists every problem on one line ("invalid TrainingJob: A; B"); ``field`` names the
            first one's wire path (``spec.replicas``, ``spec.checkpoint.foo``), ``key`` the file.
    """
    where = None
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        where = str(source)
        data = _read(where)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where or 'the object'}: a TrainingJob must be a mapping with apiVersion, kind, metadata and spec, "
            f"got a {type(data).__name__}", key=where)
    meta = data.get("metadata")
    job = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else None
    problems = [(f, f"{f} is required: add {f}: {v}") for f, v in (("apiVersion", API_VERSION), ("kind", KIND))
                if f not in data]
    try:
        parsed = TrainingJob.model_validate(data)
    except ValidationError as err:
        problems += _problems(err)
    if problems:
        raise ConfigError("invalid TrainingJob: " + "; ".join(p for _, p in problems), field=problems[0][0],
                          job=job, key=where) from None
    return parsed
