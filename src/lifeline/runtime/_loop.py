"""``train()``: a plain PyTorch training step under :func:`~lifeline.runtime.run_training`.

:class:`StatefulTrainer` adapts ``Stateful`` objects and a step function to the runtime's
:class:`~lifeline.runtime.Trainable` protocol, so a script of one's own gets exactly the reference
trainer's loop: restore at start and after every recovery, a save every ``checkpoint.every`` steps,
the progress reports the controller reads, and in-process recovery on a collective error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass
from datetime import timedelta

from torch import Tensor

from lifeline.checkpoint import Layout, PatternRules
from lifeline.errors import ConfigError
from lifeline.runtime._checkpointer import Checkpointer
from lifeline.runtime._context import RuntimeContext
from lifeline.runtime._make import make_checkpointer
from lifeline.runtime._stateful import Stateful, StatefulState, StateValues
from lifeline.runtime._training import TrainingSummary, run_training

__all__ = ["StepFn", "StepOutcome", "StatefulTrainer", "train"]

StepFn = Callable[[int], "float | Tensor | None"]
"""Runs one optimizer step, given the number of steps completed before it (0 for the first); returns
the step's loss (a float or a one-element tensor), or ``None``."""


@dataclass(frozen=True)
class StepOutcome:
    """One step as the runtime reports it: ``step`` (completed steps after it), ``loss`` (float or
    ``None``), ``tokens`` (samples or tokens of the step, whole job) and ``seconds`` (wall clock)."""

    step: int
    loss: float | None
    tokens: int
    seconds: float


class StatefulTrainer:
    """One rank's :class:`~lifeline.runtime.Trainable` made of ``Stateful`` objects and a step function.

    Args:
        states: what to checkpoint, ``{"model": model, "optim": optim, ...}`` (see
            :class:`~lifeline.runtime.StatefulState`); the process's RNG is saved too when ``rng``.
        step_fn: runs one optimizer step (:data:`StepFn`); it must be deterministic given the state
            and the step index for a recovery to be bit-identical (read data by step, not by a cursor).
        connect: called after every (re)join of a process-group generation, with the collective
            timeout: build what holds the process group here (``DistributedDataParallel(model)``).
        disconnect: called before a generation is torn down: drop every reference to what
            ``connect`` built (a live reference keeps the old group's sockets open).
        tokens_per_step: reported as ``tokens`` of each step (whole job), 0 when unknown.
        rules: the plain tensors' patterns (:class:`~lifeline.runtime.StatefulState`); the checkpointer
            takes ``self.state_of.rules`` (DTensor entries added).
    """

    def __init__(self, states: Mapping[str, Stateful], step_fn: StepFn, *,
                 connect: Callable[[timedelta | None], None] | None = None,
                 disconnect: Callable[[], None] | None = None, tokens_per_step: int = 0, rng: bool = True,
                 rules: PatternRules | None = None) -> None:
        self.state_of = StatefulState(states, rng=rng, rules=rules)
        self.step_fn, self._connect, self._disconnect = step_fn, connect, disconnect
        self.tokens_per_step = tokens_per_step
        self.step = 0
        self.initial = self.state_of.snapshot(0)

    def connect(self, timeout: timedelta | None = None) -> None:
        """Build the process-group dependent parts (the ``connect`` callable), bounded by ``timeout``."""
        if self._connect is not None:
            self._connect(timeout)

    def disconnect(self) -> None:
        """Drop them (the ``disconnect`` callable)."""
        if self._disconnect is not None:
            self._disconnect()

    def train_step(self) -> StepOutcome:
        """Run ``step_fn(step)`` and count the step."""
        start = time.perf_counter()
        loss = self.step_fn(self.step)
        self.step += 1
        value = float(loss.detach().item()) if isinstance(loss, Tensor) else (None if loss is None else float(loss))
        return StepOutcome(self.step, value, self.tokens_per_step, time.perf_counter() - start)

    def state(self) -> dict[str, Tensor | bytes]:
        """The checkpoint state now (live tensors; see :meth:`StatefulState.values`)."""
        return self.state_of.values(self.step)

    def restore_state(self) -> dict[str, Tensor | bytes]:
        """The template a restore fills (optimizers materialized: :meth:`StatefulState.template`)."""
        return self.state_of.template(self.step)

    def initial_state(self) -> dict[str, Tensor | bytes]:
        """The state when this trainer was made (step 0): what a restart from scratch loads."""
        return self.initial

    def load_state(self, values: StateValues) -> None:
        """Load ``values`` into the objects and take their step."""
        self.step = self.state_of.load(values)


@dataclass
class _OneTrainer:
    """The model spec of a script: its one trainer, whatever the layout (a plain data-parallel script
    re-wraps its model in ``connect`` after an elastic reshard; its objects stay)."""

    trainer: StatefulTrainer

    def build(self, layout: Layout, rank: int) -> StatefulTrainer:
        return self.trainer


def train(ctx: RuntimeContext, states: Mapping[str, Stateful], step_fn: StepFn, *,
          connect: Callable[[timedelta | None], None] | None = None, disconnect: Callable[[], None] | None = None,
          steps: int | None = None, every: int | None = None, rules: PatternRules | None = None,
          checkpointer: Checkpointer | None = None, tokens_per_step: int = 0, rng: bool = True,
          pipeline: Any = None) -> TrainingSummary:
    """Train ``states`` with ``step_fn`` until ``steps`` optimizer steps are complete, under the runtime.

    The loop is :func:`~lifeline.runtime.run_training`'s: at start it restores the current
    generation's plan step, else the latest complete checkpoint, else keeps the initial state; it
    calls ``step_fn(step)`` for each step still to run, reports ``step`` events, saves every
    ``every`` steps and the last one, and on a collective error (a peer lost) tears down, waits for
    the plan, rejoins, restores and goes on in this process (``connect``/``disconnect`` around it).

    Args:
        ctx: from :func:`~lifeline.runtime.init`.
        states, step_fn, connect, disconnect, tokens_per_step, rng: see :class:`StatefulTrainer`.
        steps: default ``LIFELINE_STEPS`` (the TrainingJob's ``spec.steps``).
        every: steps between checkpoints, default ``LIFELINE_CHECKPOINT_EVERY`` (``checkpoint.every``).
        rules: tensor patterns, default all replicated (data parallelism); a DTensor entry (FSDP2,
            tensor parallelism) takes its pattern from its placements instead.
        checkpointer: default :func:`~lifeline.runtime.make_checkpointer` (the sidecar, or storage
            when ``LIFELINE_CHECKPOINT_URI`` is set); leave it out for a state with DTensor entries
            (the checkpointer must plan them with the state's own rules).
        pipeline: the rank's :class:`~lifeline.runtime.Pipeline` (a ``torch.distributed.pipelining``
            stage and schedule): the steps then log what the stage sends, and a failed stage recovers
            by localized replay when the job asks for it (``recovery.localizedReplay``; docs/pipelining.md).

    Returns:
        The :class:`~lifeline.runtime.TrainingSummary` (``retired`` after an elastic shrink left this rank out).

    Raises:
        ConfigError: ``steps`` or ``every`` < 1, or bad ``states``; with ``pipeline`` and upstream
            logging on, a model that cannot replay bit for bit
            (:func:`~lifeline.runtime._pipeline_trainer.check_deterministic`).
        RecoveryError: no recovery plan came in time, or a restore failed.
        Any exception of ``step_fn`` that is not a collective error.
    """
    steps = ctx.settings.steps if steps is None else steps
    every = ctx.settings.checkpoint_every if every is None else every
    if steps < 1 or every < 1:
        raise ConfigError(f"train(steps={steps}, every={every}): both must be >= 1", field="steps", job=ctx.job)
    if pipeline is None:
        trainer = StatefulTrainer(states, step_fn, connect=connect, disconnect=disconnect,
                                  tokens_per_step=tokens_per_step, rng=rng)
    else:  # a Pipeline (lifeline.runtime._pipeline_trainer) makes its PipelineTrainer
        trainer = pipeline.trainer(states, step_fn, connect=connect, disconnect=disconnect,
                                   tokens_per_step=tokens_per_step, rng=rng,
                                   replay=getattr(ctx.settings, "upstream_log_steps", 0) > 0,
                                   stage=ctx.layout.coords(ctx.rank).pipeline)
    if rules is not None:
        trainer.state_of.rules.base = rules  # DTensor entries first, then these
    if checkpointer is None:
        checkpointer = make_checkpointer(ctx.settings, ctx.layout, trainer.state_of.rules)
    elif trainer.state_of.sharded and getattr(checkpointer, "rules", None) is not trainer.state_of.rules:
        raise ConfigError("the state holds DTensor entries: leave checkpointer= out, train() makes one that plans "
                          "them by their placements", field="checkpointer", job=ctx.job)
    return run_training(ctx, _OneTrainer(trainer), checkpointer, steps, every)
