"""What a trainer's calls to its sidecar return: :class:`SaveReceipt`, :class:`PendingSave`,
:class:`RestoreResult` (re-exported by :mod:`lifeline.sidecar.client`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lifeline.sidecar.client import SidecarClient

__all__ = ["PendingSave", "RestoreResult", "SaveReceipt"]


@dataclass(frozen=True, slots=True)
class SaveReceipt:
    """What one save cost the trainer.

    Attributes:
        step: the step saved.
        stall_seconds: wall time the trainer spent in :meth:`SidecarClient.save` (slot handover,
            memcpy into the arena and any backpressure wait).
        waited_seconds: part of the stall spent waiting for a free slot (backpressure).
        skipped: True when no slot was free under the ``skip`` policy (nothing was saved).
        nbytes: bytes copied into the arena (0 when skipped).
    """

    step: int
    stall_seconds: float
    waited_seconds: float
    skipped: bool
    nbytes: int


class PendingSave:
    """An overlapped save in flight (:meth:`SidecarClient.save_overlapped`).

    :meth:`wait` joins the background memcpy, commits the slot and returns the
    :class:`SaveReceipt`, whose ``stall_seconds`` counts only the trainer's own time: the slot
    handover, the part of the copy it waited for, and the commit. A copy that failed aborts the
    slot (nothing is committed) and its error is raised. Calling :meth:`wait` again returns the
    same receipt.
    """

    def __init__(self, client: SidecarClient, copy: Any, receipt: SaveReceipt | None, *, slot: int = -1,
                 step: int = 0, plan: Any = None, waited: float = 0.0, handed: float = 0.0) -> None:
        self._client, self._copy, self.receipt = client, copy, receipt
        self._slot, self._step, self._plan, self._waited, self._handed = slot, step, plan, waited, handed

    def wait(self) -> SaveReceipt:
        if self.receipt is not None:
            return self.receipt
        if self._client._pending is self:
            self._client._pending = None
        t0 = time.perf_counter()
        try:
            self._copy.result()
        except BaseException:
            self._client._call({"op": "abort", "slot": self._slot}, "abort")
            raise
        self.receipt = self._client._commit(self._slot, self._step, self._plan, self._waited,
                                            self._handed + (time.perf_counter() - t0), t0)
        return self.receipt


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """The outcome of a restore.

    Attributes:
        step: the step restored.
        tier: where the verified copy came from: ``"L0"`` (this pod's sidecar memory), ``"L1"``
            (a peer sidecar) or ``"L2"`` (object storage).
        nbytes: blob size in bytes.
        seconds: wall time of the restore.
    """

    step: int
    tier: str
    nbytes: int
    seconds: float
