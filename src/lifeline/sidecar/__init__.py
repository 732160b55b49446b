"""lifeline.sidecar: the checkpoint sidecar (a software DPU) and its trainer-side client.

The trainer pays one memcpy into a shared-memory arena slot (:class:`SidecarClient`); the
sidecar (:func:`run_sidecar`) seals, holds (L0), replicates to peers (L1), persists to object
storage (L2), keeps the Redis catalog and serves restores. See docs/sidecar.md.

Imports are lazy so ``lifeline --help`` does not load torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SidecarClient", "SaveReceipt", "RestoreResult", "LogKey", "Sidecar", "run_sidecar", "Catalog"]

_WHERE = {
    "SidecarClient": "lifeline.sidecar.client",
    "SaveReceipt": "lifeline.sidecar.client",
    "RestoreResult": "lifeline.sidecar.client",
    "LogKey": "lifeline.sidecar.ulog",
    "Sidecar": "lifeline.sidecar.server",
    "run_sidecar": "lifeline.sidecar.server",
    "Catalog": "lifeline.sidecar.catalog",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'lifeline.sidecar' has no attribute {name!r}")
