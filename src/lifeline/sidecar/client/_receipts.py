"""What a trainer's calls to its sidecar return: :class:`SaveReceipt`, :class:`RestoreResult`
(re-exported by :mod:`lifeline.sidecar.client`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RestoreResult", "SaveReceipt"]


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
