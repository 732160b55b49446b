"""``lifeline.runtime`` — the trainer's SDK: ``init()``, ``Checkpointer``, recovery loop, generations.

The public SDK for a training script of one's own (docs/sdk.md):

* :func:`init` reads the rank's :class:`~lifeline.api.pod.TrainerSettings` (``LIFELINE_*``) and
  joins the job's current process-group generation through a DNS-free rendezvous in the Redis
  catalog; it returns a :class:`RuntimeContext` (rank, world size, layout, generation).
* :func:`train` runs a step function over ``Stateful`` objects (model, optimizer, scheduler) under
  the runtime's loop: restore, checkpoint every N steps, progress reports, in-process recovery.
  :class:`StatefulTrainer` is its adapter to :class:`Trainable`; :class:`StatefulCheckpointer` the
  save/restore pieces for a loop of one's own; :class:`StatefulState` the flat state of those objects.
* :func:`make_checkpointer` chooses the rank's :class:`Checkpointer` (:class:`SidecarCheckpointer`,
  or :class:`StorageCheckpointer` when ``LIFELINE_CHECKPOINT_URI`` is set).
* :func:`run_training` drives a :class:`ModelSpec`'s :class:`Trainable` (the reference model's path);
  its optional hooks are the protocols :class:`BeforeUpdate`, :class:`LogsUpstream`,
  :class:`SparseOperators`, :class:`ProvidesRestoreState`, :class:`ProvidesInitialState`,
  :class:`ChecksNumerics` (the NaN and loss-spike check, docs/numerics.md).

* :class:`Pipeline` names a ``torch.distributed.pipelining`` stage and schedule for :func:`train`
  (``pipeline=``): upstream logging, localized replay and sparse operators (:class:`Operators`) for a
  pipeline of one's own (:class:`PipelineTrainer`; docs/pipelining.md).

* :mod:`lifeline.runtime.hf` (the ``hf`` extra, imported by name only): ``LifelineTrainer``, a
  Hugging Face ``transformers.Trainer`` whose own loop runs under :func:`run_training`.

See ``docs/sdk.md``, ``docs/pipelining.md`` and ``docs/runtime.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifeline._lazy import exports

if TYPE_CHECKING:  # the names type checkers see; at run time they are imported on first use (below)
    from lifeline.runtime._checkpointer import Checkpointer, StorageCheckpointer, staged_key
    from lifeline.runtime._context import RuntimeContext
    from lifeline.runtime._front import StatefulCheckpointer
    from lifeline.runtime._hooks import (BeforeUpdate, ChecksNumerics, LogsUpstream, ProvidesInitialState,
                                         ProvidesRestoreState, SparseOperators)
    from lifeline.runtime._init import init
    from lifeline.runtime._loop import StatefulTrainer, StepFn, StepOutcome, train
    from lifeline.runtime._make import make_checkpointer
    from lifeline.runtime._operators import Operators
    from lifeline.runtime._pipeline_trainer import Pipeline, PipelineTrainer
    from lifeline.runtime._rendezvous import Superseded, rendezvous
    from lifeline.runtime._sidecar import SidecarCheckpointer
    from lifeline.runtime._sparse import SparseWindows
    from lifeline.runtime._stateful import Stateful, StatefulState, StateValues
    from lifeline.runtime._trainable import ModelSpec, StepReport, Trainable
    from lifeline.runtime._training import TrainingSummary, is_collective_error, run_training
    from lifeline.runtime.events import read_events

# Lazy: the runtime imports torch, and ``lifeline.models.cli`` (imported by ``lifeline --help``) names it.
_EXPORTS = {
    "BeforeUpdate": "_hooks",
    "Checkpointer": "_checkpointer",
    "ChecksNumerics": "_hooks",
    "LogsUpstream": "_hooks",
    "ModelSpec": "_trainable",
    "Operators": "_operators",
    "Pipeline": "_pipeline_trainer",
    "PipelineTrainer": "_pipeline_trainer",
    "ProvidesInitialState": "_hooks",
    "ProvidesRestoreState": "_hooks",
    "RuntimeContext": "_context",
    "SidecarCheckpointer": "_sidecar",
    "SparseOperators": "_hooks",
    "SparseWindows": "_sparse",
    "StateValues": "_stateful",
    "Stateful": "_stateful",
    "StatefulCheckpointer": "_front",
    "StatefulState": "_stateful",
    "StatefulTrainer": "_loop",
    "StepFn": "_loop",
    "StepOutcome": "_loop",
    "StepReport": "_trainable",
    "StorageCheckpointer": "_checkpointer",
    "Superseded": "_rendezvous",
    "Trainable": "_trainable",
    "TrainingSummary": "_training",
    "init": "_init",
    "is_collective_error": "_training",
    "make_checkpointer": "_make",
    "read_events": "events",
    "rendezvous": "_rendezvous",
    "run_training": "_training",
    "staged_key": "_checkpointer",
    "train": "_loop",
}

__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "BeforeUpdate",
    "Checkpointer",
    "ChecksNumerics",
    "LogsUpstream",
    "ModelSpec",
    "Operators",
    "Pipeline",
    "PipelineTrainer",
    "ProvidesInitialState",
    "ProvidesRestoreState",
    "RuntimeContext",
    "SidecarCheckpointer",
    "SparseOperators",
    "SparseWindows",
    "StateValues",
    "Stateful",
    "StatefulCheckpointer",
    "StatefulState",
    "StatefulTrainer",
    "StepFn",
    "StepOutcome",
    "StepReport",
    "StorageCheckpointer",
    "Superseded",
    "Trainable",
    "TrainingSummary",
    "init",
    "is_collective_error",
    "make_checkpointer",
    "read_events",
    "rendezvous",
    "run_training",
    "staged_key",
    "train",
]
