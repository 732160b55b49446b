"""``lifeline.runtime`` — the trainer's SDK: ``init()``, ``Checkpointer``, recovery loop, generations.

* :func:`init` reads the rank's :class:`~lifeline.api.pod.TrainerSettings` (``LIFELINE_*``) and
  joins the job's current process-group generation through a DNS-free rendezvous in the Redis
  catalog; it returns a :class:`RuntimeContext`.
* :class:`Checkpointer` is where a rank saves and restores its shard;
  :class:`StorageCheckpointer` implements it in-process over ``lifeline.checkpoint`` storage.
* :func:`run_training` drives a :class:`ModelSpec`'s trainer: restore, train, checkpoint every
  N steps, report progress as JSON lines, and recover from collective errors in-process
  (tear down, wait for the plan, rejoin generation + 1, restore the planned step, go on).

See ``docs/runtime.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy exports: ``lifeline.runtime.cli`` is imported by ``lifeline --help`` and must not pull in torch.
_EXPORTS = {
    "Checkpointer": "_checkpointer",
    "StorageCheckpointer": "_checkpointer",
    "SidecarCheckpointer": "_sidecar",
    "staged_key": "_checkpointer",
    "RecoveryPlan": "_context",
    "RuntimeContext": "_context",
    "init": "_context",
    "Superseded": "_rendezvous",
    "rendezvous": "_rendezvous",
    "rendezvous_key": "_rendezvous",
    "ModelSpec": "_training",
    "Trainable": "_training",
    "TrainingSummary": "_training",
    "is_collective_error": "_training",
    "run_training": "_training",
    "read_events": "events",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lifeline.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lifeline.runtime.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Checkpointer",
    "ModelSpec",
    "RecoveryPlan",
    "RuntimeContext",
    "SidecarCheckpointer",
    "StorageCheckpointer",
    "Superseded",
    "Trainable",
    "TrainingSummary",
    "init",
    "is_collective_error",
    "read_events",
    "rendezvous",
    "rendezvous_key",
    "run_training",
    "staged_key",
]
