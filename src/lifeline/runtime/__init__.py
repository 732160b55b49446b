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

from lifeline._lazy import exports

# Lazy: the runtime imports torch, and ``lifeline.models.cli`` (imported by ``lifeline --help``) names it.
_EXPORTS = {
    "Checkpointer": "_checkpointer",
    "StorageCheckpointer": "_checkpointer",
    "SidecarCheckpointer": "_sidecar",
    "SparseWindows": "_sparse",
    "staged_key": "_checkpointer",
    "RuntimeContext": "_context",
    "init": "_init",
    "Superseded": "_rendezvous",
    "rendezvous": "_rendezvous",
    "ModelSpec": "_training",
    "Trainable": "_training",
    "TrainingSummary": "_training",
    "is_collective_error": "_training",
    "run_training": "_training",
    "read_events": "events",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)


__all__ = [
    "Checkpointer",
    "ModelSpec",
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
    "run_training",
    "staged_key",
]
