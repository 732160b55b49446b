"""lifeline.sidecar: the checkpoint sidecar (a software DPU) and its trainer-side client.

The trainer pays one memcpy into a shared-memory arena slot (:class:`SidecarClient`); the
sidecar (:func:`run_sidecar`) seals, holds (L0), replicates to peers (L1), persists to object
storage (L2), keeps the Redis catalog and serves restores. See docs/sidecar.md.

Imports are lazy so ``lifeline --help`` does not load torch.
"""

from __future__ import annotations

from lifeline._lazy import exports

__all__ = ["SidecarClient", "SaveReceipt", "RestoreResult", "LogKey", "Sidecar", "run_sidecar"]

__getattr__, __dir__ = exports(__name__, {
    "SidecarClient": "client",
    "SaveReceipt": "client",
    "RestoreResult": "client",
    "LogKey": "client",
    "Sidecar": "server",
    "run_sidecar": "server",
})
