"""``run_training``: the training loop with checkpoints, progress reports and in-process recovery."""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

import torch.distributed as dist

from lifeline.api.recovery import RecoveryPlan
from lifeline.api.trainingjob import RecoveryAction
from lifeline.errors import LifelineError, RecoveryError
from lifeline.runtime._checkpointer import Checkpointer
from lifeline.runtime._context import RuntimeContext
from lifeline.runtime._durable import FinalCheckpoint, JobEnd
from lifeline.runtime._hooks import (BeforeUpdate, LogsUpstream, OverlapsSave, ProvidesInitialState,
                                     ProvidesRestoreState, Relayouts, ReportsReshard, SidecarBacked,
                                     SparseOperators)
from lifeline.runtime._hold import hold_at
from lifeline.runtime._numerics import checked_step, guard_for
from lifeline.runtime._preempt import Preemption
from lifeline.runtime._rendezvous import Superseded
from lifeline.runtime._replay import UpstreamLog, localized_recovery, restore_window
from lifeline.runtime._sparse import SparseWindows
from lifeline.runtime._stragglers import StepTimes
from lifeline.runtime._trainable import ModelSpec, StepReport, Trainable
from lifeline.runtime._verify import RecoveryVerifier, perturb_point

__all__ = ["ModelSpec", "StepReport", "Trainable", "TrainingSummary", "run_training", "is_collective_error"]


@dataclass(frozen=True)
class TrainingSummary:
    """The end of :func:`run_training`: final ``step``, ``generation``, ``restarts`` of this process,
    the ``restored`` steps in order, ``last_loss`` (None off the last pipeline stage), and
    ``retired`` when an elastic reshard left this rank out of the layout before the last step."""

    step: int
    generation: int
    restarts: int
    restored: tuple[int, ...]
    last_loss: float | None
    retired: bool = False


class Retired(Exception):
    """An elastic reshard's plan has no place for this rank (raised inside :func:`_recover`)."""


_COLLECTIVE_MARKERS = ("gloo", "connection", "closed", "reset by peer", "timed out", "timeout", "broken pipe",
                       "nccl", "socket", "process group", "processgroup", "aborted")


def is_collective_error(err: BaseException) -> bool:
    """Whether ``err`` is a failure of a collective or point-to-point operation (a peer died,
    hung or the group was torn down), as opposed to a bug in the trainer."""
    if isinstance(err, (dist.DistError, Superseded)):
        return True
    if isinstance(err, (RuntimeError, ConnectionError, OSError)) and not isinstance(err, LifelineError):
        text = str(err).lower()
        return any(marker in text for marker in _COLLECTIVE_MARKERS)
    return False


def _restore(ctx: RuntimeContext, spec: ModelSpec, trainer: Trainable, checkpointer: Checkpointer,
             step: int | None, verifier: RecoveryVerifier | None = None) -> Trainable:
    """Restore ``step`` (``None``: the initial state) and arm ``verifier`` with the records of the
    steps after it (their recomputation is checked; the copy read was verified as it was read)."""
    if verifier is not None:
        verifier.arm(step or 0, how="restart from the initial state" if step is None else "restore")
    if step is None:  # nothing to restore: start over from the initial state, loaded into the trainer
        # every caller connected it already; a new trainer's ``connect`` would be a second round of
        # ``new_group`` calls that only the ranks restoring make (fuzz seeds 503, 505: in-process
        # survivors of a Rollback to the initial state waited in it for the restarted ranks, which
        # trained on, until the engine called it a hang)
        initial = (trainer.initial_state() if isinstance(trainer, ProvidesInitialState)
                   else spec.build(ctx.layout, ctx.rank).state())  # built, never connected: no collective
        trainer.load_state(initial)
        if trainer.step != 0:
            raise RecoveryError(f"the initial state loaded a trainer at step {trainer.step}", job=ctx.job,
                                rank=ctx.rank, step=0)
        ctx.report("restore", step=0, source="init")
        return trainer
    start = time.perf_counter()
    into = trainer.restore_state() if isinstance(trainer, ProvidesRestoreState) else trainer.state()
    values = checkpointer.restore(step, into=into)
    trainer.load_state(values)
    if trainer.step != step:
        raise RecoveryError(f"checkpoint of step {step} restored a trainer at step {trainer.step}",
                            job=ctx.job, rank=ctx.rank, step=step)
    reshard = checkpointer.last_reshard if isinstance(checkpointer, ReportsReshard) else None
    ctx.report("restore", step=step, seconds=round(time.perf_counter() - start, 6),
               **(reshard.fields() if reshard is not None else {}))
    return trainer


def _upstream_log(ctx: RuntimeContext, checkpointer: Checkpointer, trainer: Trainable) -> UpstreamLog | None:
    """The rank's upstream log when ``LIFELINE_UPSTREAM_LOG_STEPS`` > 0, a sidecar holds it and the
    trainer logs and replays (:class:`~lifeline.runtime.LogsUpstream`)."""
    keep = getattr(ctx.settings, "upstream_log_steps", 0)
    if (keep <= 0 or ctx.layout.pipeline < 2 or not isinstance(checkpointer, SidecarBacked)
            or not isinstance(trainer, LogsUpstream)):
        return None
    return UpstreamLog(lambda: checkpointer.client, ctx.catalog, ctx.rank, ctx.layout.coords(ctx.rank).pipeline, keep)


def _sparse_windows(ctx: RuntimeContext, checkpointer: Checkpointer, log: UpstreamLog | None,
                    trainer: Trainable) -> SparseWindows | None:
    """The rank's sparse checkpoints when ``LIFELINE_SPARSE_WINDOW`` > 0 (they live beside the upstream log)
    and the trainer names its operators (:class:`~lifeline.runtime.SparseOperators`)."""
    window = getattr(ctx.settings, "sparse_window", 0)
    if window <= 0 or log is None or not isinstance(trainer, SparseOperators):
        return None
    return SparseWindows(lambda: checkpointer.client, job=ctx.job, layout=ctx.layout, rank=ctx.rank,
                         rules=checkpointer.rules, stage=ctx.layout.coords(ctx.rank).pipeline, window=window)


def _attach(trainer: Trainable, log: UpstreamLog | None) -> Trainable:
    if log is not None and isinstance(trainer, LogsUpstream):
        trainer.log = log
    return trainer


def _apply(ctx: RuntimeContext, spec: ModelSpec, trainer: Trainable, checkpointer: Checkpointer,
           plan: RecoveryPlan, log: UpstreamLog | None, sparse: SparseWindows | None = None,
           verifier: RecoveryVerifier | None = None) -> tuple[Trainable, int | None]:
    """Restore what ``plan`` says on the joined generation: its step (every rank), or under
    ``LocalizedReplay`` only the failed stage's ranks, which then replay (:func:`localized_recovery`).
    Returns the trainer and the step restored (``None``: this rank kept its state)."""
    if plan.action is RecoveryAction.LOCALIZED_REPLAY:
        def restore(step: int | None) -> Trainable:
            return _attach(_restore(ctx, spec, trainer, checkpointer, step, verifier), log)
        kept = ctx.rank not in plan.restore_ranks
        trainer = localized_recovery(ctx, trainer, plan, restore, log, sparse, verifier)
        return trainer, None if kept else plan.restore_step or 0
    if restore_window(ctx, trainer, plan, sparse) is not None:  # the plan names a window, not a dense copy
        sparse.converting = plan.restore_step  # the loop applies the window's later slots
        if verifier is not None:  # whole again from the window's last slot on
            verifier.arm(plan.restore_step, how="window restore", not_before=plan.restore_step + sparse.window - 1)
    else:
        trainer = _attach(_restore(ctx, spec, trainer, checkpointer, plan.restore_step, verifier), log)
    if log is not None:
        log.restart_at(trainer.step)
    return trainer, plan.restore_step or 0


def _connect(ctx: RuntimeContext, trainer: Trainable) -> None:
    """``trainer.connect`` on the joined generation, then one ``join`` line with where the join went.
    The watchdog covers the sub-groups' connections as well (:meth:`RuntimeContext.watching`)."""
    start = time.perf_counter()
    with ctx.watching():
        trainer.connect(ctx.collective_timeout)
    ctx.report("join", record=False, connect=round(time.perf_counter() - start, 4), **ctx.join_seconds)


def _relayout(ctx: RuntimeContext, spec: ModelSpec, trainer: Trainable, checkpointer: Checkpointer,
              plan: RecoveryPlan) -> Trainable:
    """Adopt ``plan``'s layout when it differs (an elastic reshard kept this pod): the context and the
    checkpointer switch layouts and the trainer is rebuilt for this rank's new coordinates, in this
    process (its state is then restored from the universal checkpoint, resharded).

    Raises:
        Retired: the layout has no place for this rank.
    """
    before = ctx.layout
    if not ctx.adopt(plan):
        raise Retired(plan.generation)
    if ctx.layout == before:
        return trainer
    if not isinstance(checkpointer, Relayouts):
        raise RecoveryError(f"plan of generation {plan.generation} changes the layout to {ctx.layout.to_dict()}, "
                            f"but {type(checkpointer).__name__} cannot", job=ctx.job, rank=ctx.rank)
    checkpointer.relayout(ctx.layout, ctx.world_size)
    start, step = time.perf_counter(), trainer.step
    trainer = spec.build(ctx.layout, ctx.rank)
    ctx.report("relayout", record=False, step=step, layout=ctx.layout.to_dict(), saved_layout=before.to_dict(),
               build_seconds=round(time.perf_counter() - start, 4))
    return trainer


def _recover(ctx: RuntimeContext, spec: ModelSpec, trainer: Trainable,
             checkpointer: Checkpointer, log: UpstreamLog | None, sparse: SparseWindows | None = None,
             verifier: RecoveryVerifier | None = None
             ) -> tuple[Trainable, int | None, UpstreamLog | None, SparseWindows | None]:
    """Tear down, wait for a newer plan, rejoin its generation and restore its step; retried while
    peers keep failing. Returns the trainer, the restored step (0: initial state; ``None``: a
    localized replay in another stage, this rank kept its state), and the upstream log and sparse
    windows (new ones after a change of layout).

    Raises:
        Retired: the plan's layout (an elastic reshard) has no place for this rank.
    """
    while True:
        trainer.disconnect()
        ctx.teardown()
        gc.collect(1)  # a young reference cycle (the failure's frames) may still hold the old groups' sockets
        plan = ctx.wait_for_plan()
        # recorded: the controller sees this rank left the old generation (a rank that never says so
        # is stuck in a collective it cannot leave, and gets restarted)
        ctx.report("plan", step=trainer.step, plan_generation=plan.generation, restore_step=plan.restore_step)
        before = ctx.layout
        trainer = _relayout(ctx, spec, trainer, checkpointer, plan)  # before joining: the world size may change
        if ctx.layout != before:
            log = _upstream_log(ctx, checkpointer, trainer)
            sparse = _sparse_windows(ctx, checkpointer, log, trainer)
            _attach(trainer, log)
        try:
            generation = ctx.rejoin(plan.generation)
            if generation != plan.generation:
                newer = ctx.plan(generation)
                if newer is not None and newer.layout != plan.layout:  # another reshard came while joining:
                    raise Superseded(generation)  # wait for its plan, adopt its layout, join
                plan = newer or plan  # joined a newer one: restore what it says
            ctx.restarts += 1
            _connect(ctx, trainer)
            trainer, step = _apply(ctx, spec, trainer, checkpointer, plan, log, sparse, verifier)
            return trainer, step, log, sparse
        except Exception as err:  # noqa: BLE001
            if not is_collective_error(err):
                raise
            ctx.report("failure", step=trainer.step, error=f"{type(err).__name__}: {err}"[:500])


def run_training(ctx: RuntimeContext, model_spec: ModelSpec, checkpointer: Checkpointer, steps: int,
                 every: int = 1) -> TrainingSummary:
    """Train until ``steps`` optimizer steps are complete, checkpointing every ``every`` steps.

    At start it restores the step of the current generation's recovery plan if the catalog has
    one, else the checkpointer's latest complete step, else starts from the initial state. After
    each step it reports ``{"event": "step", "step", "loss", "tokens", "tokens_per_s", ...}`` (one
    JSON line on stdout, and the rank's progress in the catalog); after every ``every``-th step
    and the last one it saves (``checkpointer.save(step, state, generation=g)``).

    On a collective error (a peer died or hung; see :func:`is_collective_error`) or a recovery
    plan for a newer generation, it tears the process group down, waits for the plan, rejoins the
    plan's generation, restores the plan's step and goes on — in this same process.

    Raises:
        RecoveryError: no plan came before ``recovery_timeout_seconds``, or a restore failed.
        Any other exception of the trainer (a bug is not a collective error and is not retried).
    """
    if ctx.retired:
        return TrainingSummary(0, ctx.generation, 0, (), None, retired=True)
    built = time.perf_counter()
    trainer = model_spec.build(ctx.layout, ctx.rank)
    built = time.perf_counter() - built
    log = _upstream_log(ctx, checkpointer, trainer)
    sparse = _sparse_windows(ctx, checkpointer, log, trainer)
    verifier = RecoveryVerifier(ctx, getattr(checkpointer, "rules", None))
    numerics = guard_for(ctx)  # NaN and loss spikes stop a step before its update (docs/numerics.md)
    times = StepTimes.from_env(os.environ)  # compute seconds per step for the straggler scores (docs/stragglers.md)
    _attach(trainer, log)
    restored: list[int] = []
    try:
        _connect(ctx, trainer)
        plan = ctx.plan(ctx.generation) if ctx.generation > 0 else None
        if plan is not None and (plan.restore_step is not None or plan.action is RecoveryAction.LOCALIZED_REPLAY):
            trainer, step = _apply(ctx, model_spec, trainer, checkpointer, plan, log, sparse, verifier)
            if step is not None and plan.restore_step is not None:
                restored.append(step)
        elif plan is None and (start_step := checkpointer.latest_step()) is not None:
            trainer = _attach(_restore(ctx, model_spec, trainer, checkpointer, start_step, verifier), log)
            restored.append(start_step)
    except Exception as err:  # noqa: BLE001
        # a peer of this generation died while this rank connected or restored (fuzz seed 606: a fresh
        # rank's gloo mesh was refused by a peer killed during the recovery, and its exit 1 was a second
        # failure answered by a third plan): recover like a rank that was training
        if not is_collective_error(err):
            raise
        ctx.report("failure", step=trainer.step, error=f"{type(err).__name__}: {err}"[:500])
        ctx.recovering(True)
        try:
            trainer, step, log, sparse = _recover(ctx, model_spec, trainer, checkpointer, log, sparse, verifier)
        except Retired as retired:
            ctx.report("retired", step=trainer.step, plan_generation=retired.args[0], world_size=ctx.world_size)
            return TrainingSummary(trainer.step, ctx.generation, ctx.restarts, (), None, retired=True)
        if step is not None:
            restored.append(step)
    ctx.report("start", step=trainer.step, steps=steps, every=every, world_size=ctx.world_size,
               layout=ctx.layout.to_dict(), build_seconds=round(built, 4))
    # only with a trainer that calls before_update (else the copy would race its optimizer update)
    overlap = (bool(getattr(ctx.settings, "overlap_save", False)) and isinstance(checkpointer, OverlapsSave)
               and isinstance(trainer, BeforeUpdate))

    def settle() -> None:
        """Finish the overlapped save in flight (called before an optimizer update writes the state)."""
        receipt = checkpointer.settle()
        if receipt is not None:
            ctx.report("save", step=receipt.step, seconds=round(receipt.stall_seconds, 6), overlapped=True,
                       stall_seconds=receipt.stall_seconds, waited_seconds=receipt.waited_seconds,
                       skipped=receipt.skipped)

    last_loss = None
    final = FinalCheckpoint(ctx, checkpointer, steps)
    end = JobEnd(ctx)
    preempt = Preemption.install(every)  # SIGTERM: checkpoint the step to L1, then leave (LIFELINE_PREEMPT_GRACE_SECONDS)

    def save_final() -> None:
        receipt = checkpointer.save(trainer.step, trainer.state(), generation=ctx.generation)
        ctx.report("save", step=trainer.step, stall_seconds=getattr(receipt, "stall_seconds", None))

    ended = False
    while not ended:
        try:
            newer = ctx.newer_generation()
            if newer is not None:
                raise Superseded(newer)
            if trainer.step >= steps and not final.durable():  # trained: held until the final checkpoint is in L2
                final.wait_once(save_final)
                continue
            if trainer.step >= steps:  # finished: held until every rank finished (a late failure needs this one)
                if overlap and not end.reported:
                    settle()
                ended = end.ended(step=trainer.step, restarts=ctx.restarts, loss=last_loss)
                continue
            if overlap:
                trainer.before_update = settle
            times.before_step(trainer.step + 1)  # an injected ``slow`` fault sleeps here
            result = checked_step(numerics, trainer, log, sparse)
            timed = times.after_step(result)
            last_loss = result.loss
            logged = {}
            if sparse is not None:  # the slot first: the log's coverage record then covers it too
                sparse.catch_up(result.step, trainer)
                sparse.capture(result.step, trainer, result.seconds)
                logged.update(sparse.take_counts())
            if log is not None:
                log.step_done(result.step)
                logged.update(log.take_counts())
            perturb_point(ctx.generation, ctx.rank, result.step, trainer.state)  # a test's fault, when set
            if verifier.due(result.step):  # a recomputed step equals its copy from before the failure
                verifier.check(result.step, trainer.state())
            ctx.report("step", step=result.step, loss=result.loss, tokens=result.tokens,
                       seconds=round(result.seconds, 6), **logged, **timed, **times.fields(),
                       tokens_per_s=round(result.tokens / result.seconds, 1) if result.seconds > 0 else None)
            ctx.recovering(False)  # trained a step: step reports are its liveness now
            if overlap and result.step % every == 0 and result.step < steps:
                checkpointer.save_overlapped(result.step, trainer.state(), generation=ctx.generation)
            elif result.step % every == 0 or result.step == steps:
                t0 = time.perf_counter()
                receipt = checkpointer.save(result.step, trainer.state(), generation=ctx.generation)
                extra = {k: getattr(receipt, k) for k in ("stall_seconds", "waited_seconds", "skipped")
                         if hasattr(receipt, k)}
                ctx.report("save", step=result.step, seconds=round(time.perf_counter() - t0, 6), **extra,
                           **times.fields())
            hold_at(ctx, result.step, settle if overlap else None)  # a fault `lifeline run` injects at this step lands here
            if preempt is not None:  # told to leave (any rank, when every > 1): this step checkpointed, to L1
                preempt.boundary(ctx, checkpointer, trainer, result.step, settle=settle if overlap else None,
                                 saved=result.step % every == 0 or result.step == steps)
        except Exception as err:  # noqa: BLE001 - classified below
            if not is_collective_error(err) or ctx.catalog is None:
                raise
            failed = f"{type(err).__name__}: {err}"[:500]
        else:
            continue
        # Recover outside the except block: the exception's traceback holds the frames of the failed
        # collective, whose locals reference this generation's process groups; while it lives, their
        # gloo sockets stay open and peers blocked on this rank wait out their collective timeout.
        ctx.report("failure", step=trainer.step, error=failed)
        ctx.recovering(True)  # alive while it waits, rejoins and restores: off after its next step
        if overlap:  # the copy of the last step is whole: commit it before any restore writes the state
            try:
                settle()
            except (LifelineError, OSError) as err:
                ctx.report("save_failed", record=False, step=trainer.step, error=f"{type(err).__name__}: {err}"[:300])
        try:
            trainer, step, log, sparse = _recover(ctx, model_spec, trainer, checkpointer, log, sparse, verifier)
        except Retired as retired:
            ctx.report("retired", step=trainer.step, plan_generation=retired.args[0], world_size=ctx.world_size)
            return TrainingSummary(trainer.step, ctx.generation, ctx.restarts, tuple(restored), last_loss, retired=True)
        if step is not None:
            restored.append(step)
            final.resave = trainer.step >= steps
        end.reset()
    return TrainingSummary(trainer.step, ctx.generation, ctx.restarts, tuple(restored), last_loss)
