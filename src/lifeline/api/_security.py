"""Least-privilege security contexts of the pods the operator builds (pure, no I/O).

Every rank pod meets the Kubernetes Pod Security Standard ``restricted`` (the PodSecurity
admission level of that name): non-root, ``RuntimeDefault`` seccomp profile, every Linux
capability dropped, no privilege escalation; the root filesystem is read-only, and the only
writable paths are emptyDir volumes (the Memory-backed arena at ``/dev/shm`` and a small
``/tmp``).

The injected sidecar always gets the full restricted context. The user's trainer container and
the pod get these values only where the template leaves a key unset: a template that sets, e.g.,
``runAsUser`` or ``readOnlyRootFilesystem: false`` keeps its choice (an explicit opt-out, which
PodSecurity admission of a ``restricted`` namespace then judges).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = [
    "RUN_AS_USER",
    "TMP_VOLUME",
    "TMP_MOUNT",
    "restricted_container_context",
    "restricted_pod_context",
    "with_defaults",
]

RUN_AS_USER = 1000
"""uid (and gid) of the image's ``lifeline`` user (the Dockerfile at the repository root: ``USER 1000``)."""
TMP_VOLUME = "lifeline-tmp"
TMP_MOUNT = "/tmp"


def restricted_pod_context() -> dict[str, Any]:
    """The pod-level ``securityContext``: non-root uid/gid :data:`RUN_AS_USER`, seccomp RuntimeDefault."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_context() -> dict[str, Any]:
    """A container's ``securityContext``: read-only root, all capabilities dropped, no escalation."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def with_defaults(given: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` with every key the user set in ``given`` kept as given (a deep copy)."""
    out = copy.deepcopy(dict(defaults))
    out.update(copy.deepcopy(dict(given or {})))
    return out
