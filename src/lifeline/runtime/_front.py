"""``StatefulCheckpointer``: save and restore ``Stateful`` objects by hand, for a loop of one's own."""

from __future__ import annotations

import time
from collections.abc import Mapping

from lifeline.checkpoint import PatternRules
from lifeline.errors import RecoveryError
from lifeline.runtime._checkpointer import Checkpointer
from lifeline.runtime._context import RuntimeContext
from lifeline.runtime._make import make_checkpointer
from lifeline.runtime._stateful import Stateful, StatefulState

__all__ = ["StatefulCheckpointer"]


class StatefulCheckpointer:
    """A rank's checkpoints of ``{"model": model, "optim": optim, ...}`` through the job's
    :class:`~lifeline.runtime.Checkpointer`, in the universal format (:class:`StatefulState`).

    The pieces :func:`~lifeline.runtime.train` runs for you, for a loop you keep yourself: call
    :meth:`restore` once after :func:`~lifeline.runtime.init` (it returns the step to start from),
    :meth:`save` after every ``ctx.settings.checkpoint_every``-th step and the last one, and
    ``ctx.report("step", step=..., loss=...)`` after every step (the controller's progress signal).
    Such a loop does not recover in its process: let a collective error end it (non-zero exit); the
    controller restarts the process (or replaces the pod) and :meth:`restore` reads the plan's step
    from memory (L0/L1) or L2.

    Args:
        ctx: from :func:`~lifeline.runtime.init`.
        states: see :class:`StatefulState` (names without dots; the unwrapped module).
        rules: tensor patterns, default all replicated (data parallelism); DTensor entries (FSDP2,
            tensor parallelism) take theirs from their placements (``self.state.rules``).
        checkpointer: default :func:`~lifeline.runtime.make_checkpointer` for ``ctx`` with
            ``self.state.rules`` (leave it out for a state with DTensor entries).
        rng: also save and restore the process's torch CPU and ``random`` generators.
    """

    def __init__(self, ctx: RuntimeContext, states: Mapping[str, Stateful], *, rules: PatternRules | None = None,
                 checkpointer: Checkpointer | None = None, rng: bool = True) -> None:
        self.ctx = ctx
        self.state = StatefulState(states, rng=rng, rules=rules)
        self.checkpointer = checkpointer if checkpointer is not None else make_checkpointer(
            ctx.settings, ctx.layout, self.state.rules)

    def restore(self) -> int:
        """Restore the step the current generation's recovery plan names, else the latest complete
        checkpoint; nothing when there is none. Returns the step restored (0: the initial state).

        Raises:
            RecoveryError: the restore read a state of another step.
            CheckpointError, SidecarError: no verified copy could be read.
        """
        plan = self.ctx.plan(self.ctx.generation) if self.ctx.generation > 0 else None
        step = plan.restore_step if plan is not None else self.checkpointer.latest_step()
        if step is None:
            return 0
        start = time.perf_counter()
        values = self.checkpointer.restore(step, into=self.state.template(step))
        restored = self.state.load(values)
        if restored != step:
            raise RecoveryError(f"checkpoint of step {step} holds step {restored}", job=self.ctx.job,
                                rank=self.ctx.rank, step=step)
        self.ctx.report("restore", step=step, seconds=round(time.perf_counter() - start, 6))
        return step

    def save(self, step: int) -> None:
        """Save the objects' state after ``step`` completed optimizer steps and report a ``save`` event.

        Raises:
            SidecarError, StorageError: the copy could not be handed over.
        """
        start = time.perf_counter()
        receipt = self.checkpointer.save(step, self.state.values(step), generation=self.ctx.generation)
        extra = {k: getattr(receipt, k) for k in ("stall_seconds", "waited_seconds", "skipped") if hasattr(receipt, k)}
        self.ctx.report("save", step=step, seconds=round(time.perf_counter() - start, 6), **extra)
