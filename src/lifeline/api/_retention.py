"""What a job's spec asks each rank to keep for localized replay: upstream-log steps and the sparse window.

Pure functions of the spec; :mod:`lifeline.api.manifests` hands them to the trainers as
``LIFELINE_UPSTREAM_LOG_STEPS`` and ``LIFELINE_SPARSE_WINDOW``.
"""

from __future__ import annotations

from lifeline.api.trainingjob import TrainingJobSpec

__all__ = ["upstream_log_steps", "sparse_window"]


def upstream_log_steps(spec: TrainingJobSpec) -> int:
    """Steps of upstream log each rank keeps: two windows (the sparse window, else the checkpoint
    interval), at least 2; 0 when ``spec.recovery.localizedReplay`` is off or there is one stage."""
    if not spec.recovery.localized_replay or spec.layout.pipeline < 2:
        return 0
    window = spec.checkpoint.sparse.window if spec.checkpoint.sparse else spec.checkpoint.every
    return max(2, 2 * window)


def sparse_window(spec: TrainingJobSpec) -> int:
    """W of the job's sparse checkpoints (``spec.checkpoint.sparse.window``), or 0 when off.

    Sparse slots live in the sidecars' log store next to the upstream log and serve localized
    replay, so they are taken only when upstream logging is on (:func:`upstream_log_steps` > 0).
    """
    if spec.checkpoint.sparse is None or upstream_log_steps(spec) == 0:
        return 0
    return spec.checkpoint.sparse.window
