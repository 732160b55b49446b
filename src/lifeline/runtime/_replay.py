"""Upstream logging and localized replay (after MoEvement, Gandhi et al., arXiv 2412.15411, §5).

:class:`UpstreamLog` is the trainer's :class:`StageLog` and :class:`ReplaySource` over the pod's
sidecar: every tensor a rank sends across a pipeline boundary goes to its sidecar's log store
(replicated to a peer on another node), keyed by ``(iteration, micro-batch, stage, direction)``;
the range of steps a rank's log covers is recorded in the catalog after every step, and entries
older than ``keep_steps`` are dropped.

:func:`localized_recovery` applies a ``LocalizedReplay`` plan in one rank: the ranks of the
failed stage restore the plan's step and replay to ``replay_to_step`` from their neighbours' logs;
every other rank drops its partial step, keeps its state and waits for them. Nobody else restores
or recomputes anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lifeline.api.recovery import RecoveryPlan
from lifeline.catalog import Catalog
from lifeline.errors import CatalogError, LifelineError, RecoveryError
from lifeline.runtime._verify import perturb_point
from lifeline.sidecar.client import LogKey, SidecarClient

__all__ = ["UpstreamLog", "localized_recovery", "restore_window"]

_REPLAYED = "replayed"


class UpstreamLog:
    """A rank's upstream log in its sidecar (what the trainer records, what a replay fetches).

    Args:
        client: a callable returning the connected ``SidecarClient`` (the checkpointer's, made on
            first use).
        catalog: the job's catalog (coverage records), or ``None``.
        rank, stage: this rank and its pipeline stage.
        keep_steps: steps of log kept (two windows); older entries are dropped from the sidecar.
    """

    def __init__(self, client: Callable[[], SidecarClient], catalog: Catalog | None, rank: int, stage: int,
                 keep_steps: int) -> None:
        self._client, self.catalog = client, catalog
        self.rank, self.stage, self.keep_steps = rank, stage, max(1, keep_steps)
        self.first: int | None = None
        self.last: int | None = None
        self.bytes_logged = 0
        self.seconds = 0.0
        self._taken = (0, 0.0)

    def record(self, iteration: int, micro_batch: int, direction: str, tensor: Tensor) -> None:
        """Store one sent tensor (bytes as they are) in the sidecar's log."""
        t0 = time.perf_counter()
        self._client().put_log(LogKey(iteration, micro_batch, self.stage, direction), tensor)
        self.bytes_logged += tensor.numel() * tensor.element_size()
        self.seconds += time.perf_counter() - t0

    def step_done(self, step: int) -> None:
        """Step ``step`` (completed steps) is logged whole: drop entries older than ``keep_steps`` and tell
        the sidecar the covered range ``first..last``, which it records in the catalog once the entries
        reached its peers (a plan relies on replicated coverage only; best effort while Redis is away)."""
        self.first = step if self.first is None or step < self.first else self.first
        self.last = step if self.last is None else max(self.last, step)
        before = step - self.keep_steps  # iterations < before (steps <= before) are dropped
        if before > 0 and step % max(1, self.keep_steps // 2) == 0:
            self._client().gc_logs(before)
        if before > 0:
            self.first = max(self.first, before + 1)
        self._client().log_done(self.first, self.last)

    def take_counts(self) -> dict[str, float]:
        """Bytes logged and seconds spent logging since the previous call (per-step reporting)."""
        out = {"log_bytes": self.bytes_logged - self._taken[0], "log_seconds": round(self.seconds - self._taken[1], 6)}
        self._taken = (self.bytes_logged, self.seconds)
        return out

    def restart_at(self, step: int) -> None:
        """The rank's state went back to ``step`` (a restore).

        What it logged before is still held (its sidecar's store, or the peer's replicas when the
        sidecar was lost), and what it logs again from ``step`` on is the same, bit for bit
        (invariant 1; a replay checks it), so the coverage stays ``first..last``; a restarted
        process takes the coverage it recorded in the catalog before the failure. The sparse slots
        of a window being replayed thus stay restorable: a failure during the replay restores the
        same window again. A restore before ``first`` starts the coverage over. Steps whose original
        and replica both died since (two sidecars lost) are cut by the catalog, which records the
        coverage from the step after them on (:meth:`lifeline.catalog.Catalog.record_log_coverage`)."""
        if self.first is None and self.catalog is not None:
            try:
                mine = [c for c in self.catalog.log_coverage() if c.rank == self.rank]
            except CatalogError:
                mine = []
            if mine:
                self.first, self.last = mine[0].first_step, mine[0].last_step
        if self.first is None or self.last is None or self.first > step:
            self.first = self.last = None

    def fetch(self, out: Tensor, *, iteration: int, micro_batch: int, stage: int, direction: str,
              rank: int) -> None:
        """Fill ``out`` with the entry ``rank`` logged (from its sidecar or the peer holding its copy).

        Raises:
            RecoveryError: the entry is gone or has another size than ``out``.
        """
        key = LogKey(iteration, micro_batch, stage, direction)
        try:
            data = self._client().get_log(key, rank=rank)
        except LifelineError as err:
            raise RecoveryError(f"upstream log {key} of rank {rank} is not available: {err}", rank=self.rank,
                                step=iteration + 1) from err
        if len(data) != out.numel() * out.element_size():
            raise RecoveryError(f"upstream log {key} of rank {rank} holds {len(data)} bytes, expected "
                                f"{out.numel() * out.element_size()}", rank=self.rank, step=iteration + 1)
        out.view(-1).view(torch.uint8).copy_(torch.frombuffer(data, dtype=torch.uint8))


def localized_recovery(ctx: Any, trainer: Any, plan: RecoveryPlan, restore: Any, log: UpstreamLog | None,
                       sparse: Any = None, verifier: Any = None) -> Any:
    """Apply a ``LocalizedReplay`` plan in this rank after joining its generation; returns the trainer.

    * A rank in ``plan.restore_ranks``: when the plan names a sparse window (``plan.restore_window``)
      it loads slot 0 from ``sparse`` (its :class:`~lifeline.runtime._sparse.SparseWindows`; a
      ``restore`` event with ``source: "window"``) and applies each later slot of the window after
      replaying its step; otherwise ``restore(plan.restore_step)`` (the caller's dense restore,
      which reports it). Then ``trainer.replay_step(log)`` until ``plan.replay_to_step``, reporting
      a ``replay`` event per step and one ``replayed`` event; then it arrives at the waypoint.
    * Any other rank: drops its partial step (``abandon_step``) and waits, without restoring, for
      every replaying rank to arrive (a store wait bounded by the recovery timeout).

    Raises:
        RecoveryError: a surviving rank is not at ``plan.replay_to_step`` (its state is not the one
            the replay catches up to: the ranks fall back to a global recovery, never to a wrong
            state), the logs are missing, or the replay diverged.
        Superseded: a newer plan was published while waiting.
    """
    target = plan.replay_to_step if plan.replay_to_step is not None else plan.restore_step
    if ctx.rank in plan.restore_ranks:
        window = restore_window(ctx, trainer, plan, sparse)
        if window is None:
            trainer = restore(plan.restore_step)  # arms ``verifier`` itself
        elif verifier is not None:  # whole again from the window's last slot on
            verifier.arm(window, how="localized replay of a window", not_before=window + sparse.window - 1)
        if log is None:
            raise RecoveryError("a LocalizedReplay plan reached a rank without upstream logging "
                                "(LIFELINE_UPSTREAM_LOG_STEPS=0)", job=ctx.job, rank=ctx.rank)
        log.restart_at(trainer.step)
        trainer.log = log
        start, first = time.perf_counter(), trainer.step
        while trainer.step < target:
            _fault_point(ctx.rank, trainer.step + 1)
            t0 = time.perf_counter()
            result = trainer.replay_step(log)
            if window is not None:
                sparse.apply(result.step, window, trainer)
            perturb_point(ctx.generation, ctx.rank, result.step, trainer.state)  # a test's fault, when set
            if verifier is not None and verifier.due(result.step):  # equal to the copy saved before the failure
                verifier.check(result.step, trainer.state())
            log.step_done(result.step)
            ctx.report("replay", step=result.step, loss=result.loss,
                       seconds=round(time.perf_counter() - t0, 6))
        ctx.report("replayed", step=trainer.step, steps=trainer.step - first,
                   seconds=round(time.perf_counter() - start, 6), log_bytes=log.bytes_logged)
        ctx.arrive(_REPLAYED)
        return trainer
    trainer.abandon_step()
    if trainer.step != target:
        raise RecoveryError(f"localized replay to step {target}, but this surviving rank is at step {trainer.step}",
                            job=ctx.job, rank=ctx.rank, step=trainer.step)
    start = time.perf_counter()
    ctx.report("keep", step=trainer.step)
    ctx.await_count(_REPLAYED, len(plan.restore_ranks))
    ctx.report("waited", record=False, step=trainer.step, seconds=round(time.perf_counter() - start, 6))
    return trainer


def restore_window(ctx: Any, trainer: Any, plan: RecoveryPlan, sparse: Any) -> int | None:
    """Load slot 0 of the sparse window the plan names (``plan.restore_window``), returning its start;
    ``None`` when the plan names a dense copy (the caller restores that one).

    The plan's choice is followed exactly: a step that merely starts a window is never restored from
    the window when the plan chose the dense copy of that step (its later slots were not captured
    yet, or belong to an older incarnation of the window), and a window the plan chose is never
    replaced by another copy.

    Raises:
        RecoveryError: the plan names a window but this rank keeps no sparse checkpoints, its W
            differs, or slot 0 is not available or fails its checksum (the next recovery plans
            without this copy).
    """
    step, w = plan.restore_step, plan.restore_window
    if w is None or step is None:
        return None
    if sparse is None or sparse.window != w:
        raise RecoveryError(f"the plan of generation {plan.generation} restores the sparse window of {w} steps "
                            f"starting at step {step}, but this rank keeps "
                            + ("no sparse checkpoints" if sparse is None else f"windows of {sparse.window} steps"),
                            job=ctx.job, rank=ctx.rank, step=step)
    start = time.perf_counter()
    try:
        sparse.restore(step, trainer)
    except LifelineError as err:
        ctx.report("window_unavailable", record=False, step=step, error=f"{type(err).__name__}: {err}"[:300])
        raise RecoveryError(f"the sparse window starting at step {step} that the plan of generation "
                            f"{plan.generation} names is not available: {err}", job=ctx.job, rank=ctx.rank,
                            step=step) from err
    ctx.report("restore", step=step, source="window", window=sparse.window,
               seconds=round(time.perf_counter() - start, 6))
    return step


FAULT_ENV = "LIFELINE_FAULT_IN_REPLAY"
"""Fault injection for tests and the chaos benchmark: ``"<rank>:<step>"`` makes that rank's trainer die
(exit 137, as a SIGKILL) just before it replays ``step`` — a failure during a localized replay."""


def _fault_point(rank: int, step: int) -> None:
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted and wanted == f"{rank}:{step}":
        os._exit(137)
