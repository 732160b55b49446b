"""``make_checkpointer``: the rank's :class:`~lifeline.runtime.Checkpointer`, chosen from its settings."""

from __future__ import annotations

from lifeline.api.pod import TrainerSettings
from lifeline.checkpoint import Layout, PatternRules, storage_from_uri
from lifeline.runtime._checkpointer import Checkpointer, StorageCheckpointer
from lifeline.runtime._sidecar import SidecarCheckpointer

__all__ = ["make_checkpointer"]


def make_checkpointer(settings: TrainerSettings, layout: Layout, rules: PatternRules) -> Checkpointer:
    """The rank's checkpointer: a :class:`StorageCheckpointer` writing in the trainer's process when
    ``LIFELINE_CHECKPOINT_URI`` is set (``file://``, a path, ``s3://``: tests and runs without a
    sidecar), else a :class:`SidecarCheckpointer` (the pod's sidecar: L0, then L1 and L2).

    Args:
        settings: the rank's settings (``ctx.settings`` after :func:`~lifeline.runtime.init`).
        layout: the job's layout (``ctx.layout``).
        rules: how the state's tensors map to logical tensors (``PatternRules()``: all replicated,
            right for plain data parallelism).

    Raises:
        ConfigError, StorageError: the checkpoint URI is malformed or its storage unreachable.
    """
    if settings.checkpoint_uri:
        storage, prefix = storage_from_uri(settings.checkpoint_uri)
        return StorageCheckpointer(storage, prefix, settings.job, layout, settings.rank, rules)
    return SidecarCheckpointer(settings, layout, rules)
