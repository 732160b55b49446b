"""The trainer's side of the sidecar: what a training process imports to reach its pod's sidecar.

* :class:`SidecarClient` — saves into the shared-memory arena (one memcpy), restores from the
  nearest verified copy (L0 → L1 → L2), and puts and gets upstream-log entries (:class:`LogKey`).
* :class:`SaveReceipt`, :class:`RestoreResult`, :class:`PendingSave` — what a save or restore returns.
* :class:`HostStager` — a pinned host buffer for device tensors on their way to the arena.
* :func:`write_parallel` — a save's copy into its slot, split over threads (what a save's stall is).
* :mod:`.reader` — :class:`~lifeline.sidecar.client.reader.SidecarBlobReader`, byte ranges of a
  step's blobs from the sidecars holding them (resharding restores).
* :mod:`.arena` — the arena's slot files, shared with the sidecar's server side. The socket's
  frames are :mod:`lifeline.sidecar.frames` (both sides, and the peer protocol, speak them).

Nothing here imports the sidecar's server (an import-linter contract keeps it so): a trainer
process loads the client and its protocol, not the daemon.
"""

from __future__ import annotations

from lifeline.sidecar.client._client import PendingSave, SidecarClient
from lifeline.sidecar.client._copy import write_parallel
from lifeline.sidecar.client._logkey import DIRECTIONS, LogKey
from lifeline.sidecar.client._receipts import RestoreResult, SaveReceipt
from lifeline.sidecar.client._staging import HostStager

__all__ = ["DIRECTIONS", "HostStager", "LogKey", "PendingSave", "RestoreResult", "SaveReceipt", "SidecarClient",
           "write_parallel"]
