"""Names and URIs of a TrainingJob: ``metadata.name`` (a Kubernetes name) and the L2 URI, as pure checks."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["NAME_RE", "NAME_MAX", "SEED_MAX", "PERSIST_URI_PATTERN", "check_name", "check_persist_uri"]

NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""``metadata.name``: an RFC 1123 subdomain (lower-case letters, digits, ``-`` and ``.``; starts and ends
with a letter or digit), as Kubernetes validates object names."""

NAME_MAX = 63
"""Longest ``metadata.name``: the name is a label value on the job's pods (at most 63 characters)."""

SEED_MAX = 2**32 - 1
"""Largest ``spec.seed`` (a 32-bit seed: every generator the trainers seed takes it, with room for offsets)."""

_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
_CONTAINER = r"[a-z0-9](-?[a-z0-9]){2,62}"
_GCS_BUCKET = r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"
PERSIST_URI_PATTERN = (rf"^(s3://{_BUCKET}(/\S*)?|az://{_CONTAINER}(/\S*)?|gs://{_GCS_BUCKET}(/\S*)?"
                       r"|file:///\S*)$")
"""``spec.checkpoint.persist.uri`` in the CRD: ``s3://bucket[/prefix]`` (an S3 bucket name),
``az://container[/prefix]`` (an Azure Blob Storage container name), ``gs://bucket[/prefix]`` (a Google
Cloud Storage bucket name of 3-63 characters) or ``file:///path``."""


def check_name(name: Any) -> str | None:
    """Why ``name`` is not a valid ``metadata.name`` (``None`` when it is). Pure; raises nothing."""
    if not isinstance(name, str) or not name:
        return "metadata.name must be a non-empty string"
    if len(name) > NAME_MAX or not NAME_RE.fullmatch(name):
        return (f"metadata.name {name!r} is not a Kubernetes name: use at most {NAME_MAX} lower-case letters, "
                "digits, '-' or '.', starting and ending with a letter or digit (e.g. gpt-moe)")
    return None


def check_persist_uri(uri: Any, field: str = "spec.checkpoint.persist.uri") -> str | None:
    """Why ``uri`` is not an L2 URI (``None`` when it is): ``s3://bucket[/prefix]`` with a valid S3 bucket
    name (3-63 lower-case letters, digits, '.', '-'), ``az://container[/prefix]`` with a valid Azure container
    name (3-63 lower-case letters, digits, single '-'), ``gs://bucket[/prefix]`` with a valid GCS bucket name
    (3-63 lower-case letters, digits, '.', '-', '_') or ``file:///absolute/path``. Pure; raises nothing."""
    example = ("use s3://bucket/prefix (e.g. s3://lifeline/checkpoints), az://container/prefix, gs://bucket/prefix "
               "or file:///absolute/path")
    if not isinstance(uri, str) or not re.fullmatch(r"(s3|az|gs|file)://\S+", uri):
        return f"{field} {uri!r} is not an L2 URI: {example}"
    if uri.startswith("s3://"):
        bucket = uri[5:].split("/", 1)[0]
        if not re.fullmatch(_BUCKET, bucket) or ".." in bucket:
            return (f"{field} {uri!r}: {bucket!r} is not an S3 bucket name (3-63 lower-case letters, digits, "
                    "'.' or '-', starting and ending with a letter or digit)")
    elif uri.startswith("az://"):
        container = uri[5:].split("/", 1)[0]
        if len(container) > 63 or not re.fullmatch(_CONTAINER, container):
            return (f"{field} {uri!r}: {container!r} is not an Azure container name (3-63 lower-case letters, "
                    "digits or single '-', starting and ending with a letter or digit)")
    elif uri.startswith("gs://"):
        bucket = uri[5:].split("/", 1)[0]
        if not re.fullmatch(_GCS_BUCKET, bucket) or ".." in bucket:
            return (f"{field} {uri!r}: {bucket!r} is not a GCS bucket name (3-63 lower-case letters, digits, "
                    "'.', '-' or '_', starting and ending with a letter or digit)")
    elif not uri.startswith("file:///"):
        return f"{field} {uri!r}: a file URI needs an absolute path (file:///path); {example}"
    return None
