"""Storage keys of a checkpoint: ``<prefix>/<job>/<step:012d>/{rank-<r>.bin, manifest.json}``."""

from __future__ import annotations

import re

from lifeline.errors import ManifestError

__all__ = ["step_prefix", "blob_key", "manifest_key", "MANIFEST_RE"]

MANIFEST_RE = re.compile(r"(\d{12})/manifest\.json$")
"""Matches ``<step:012d>/manifest.json`` (a key relative to ``<prefix>/<job>/``); group 1 is the step."""


def step_prefix(prefix: str, job: str, step: int) -> str:
    """``<prefix>/<job>/<step:012d>`` (no leading slash when ``prefix`` is empty).

    Raises :class:`ManifestError` for a negative ``step``.
    """
    if step < 0:
        raise ManifestError(f"step {step} must be >= 0", job=job, step=step)
    return "/".join(p for p in (prefix.strip("/"), job, f"{step:012d}") if p)


def blob_key(prefix: str, job: str, step: int, rank: int) -> str:
    """``<prefix>/<job>/<step:012d>/rank-<r>.bin``: rank ``rank``'s blob."""
    return f"{step_prefix(prefix, job, step)}/rank-{rank}.bin"


def manifest_key(prefix: str, job: str, step: int) -> str:
    """``<prefix>/<job>/<step:012d>/manifest.json``: the commit marker."""
    return f"{step_prefix(prefix, job, step)}/manifest.json"
