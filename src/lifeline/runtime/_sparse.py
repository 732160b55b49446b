"""Sparse expert checkpoints (MoEvement, Gandhi et al., arXiv 2412.15411, §4) through the sidecar.

:class:`SparseWindows` captures one **slot** per step into the sidecar's log store (replicated to
the L1 peer with the upstream log, kept and garbage-collected with it): at step ``start + i`` of a
window of W steps (``start`` a multiple of W) the operators of slot ``i`` ACTIVE (weights and AdamW
state), the operators of later slots FROZEN (weights, in the trainer's ``compute_dtype``) and the
byte entries (data position, RNG; the learning rate is a function of the step and the gradient norm
comes from the upstream log).
The schedule is planned at every window start (:func:`lifeline.checkpoint.plan_window`, least
popular experts first, over the activation counts of the previous window and a budget of the
last step's time x the measured copy bandwidth), stretched to W (:func:`with_window`).

Restoring a window (:meth:`SparseWindows.restore`) loads slot 0; replaying step ``start + i``
(``1 <= i < W``) and then applying slot ``i`` (:meth:`SparseWindows.apply`) gives the FROZEN
operators their captured weights and promotes slot ``i``'s operators to ACTIVE. Unlike MoEvement,
the replay also computes the weight gradients of FROZEN operators: they enter the gradient-norm
check of :meth:`~lifeline.models.gpt_moe.GPTMoETrainer.replay_step`, which then proves the FROZEN
weights exact bit for bit; their optimizer update is overwritten by the next slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lifeline.checkpoint import (
    Layout,
    PatternRules,
    SlotRecord,
    budget_bytes,
    pack_slot,
    plan_window,
    slot_entries,
    slot_record,
    unpack_slot,
    with_window,
)
from lifeline.errors import LifelineError, RecoveryError
from lifeline.runtime._hooks import ProvidesRestoreState
from lifeline.sidecar.client import LogKey, SidecarClient

__all__ = ["SparseWindows"]

_DEFAULT_COPY_BPS = 1e9  # until a slot has been packed and its copy rate measured
_UNBOUNDED = 1 << 62


class SparseWindows:
    """A rank's sparse checkpoints: one slot per step into its sidecar's log store.

    Args:
        client: a callable returning the connected ``SidecarClient``.
        job, layout, rank, rules: whose state (the slot blobs are in the universal format).
        stage: this rank's pipeline stage (the log key's stage).
        window: W, steps per window (>= 1).

    The trainer must provide ``state()``, ``load_state()``, ``step``, ``sparse_operators(activations)``
    and ``expert_activations()`` (:class:`~lifeline.models.gpt_moe.GPTMoETrainer` does).
    """

    def __init__(self, client: Callable[[], SidecarClient], *, job: str, layout: Layout, rank: int,
                 rules: PatternRules, stage: int, window: int) -> None:
        self._client = client
        self.job, self.layout, self.rank, self.rules, self.stage = job, layout, rank, rules, stage
        self.window = max(1, int(window))
        self.schedule = None
        self.over_budget = False
        self.converting: int | None = None
        """Start of a window restored for a global recovery: :meth:`catch_up` applies its later slots."""
        self.bytes_captured = 0
        self.seconds = 0.0
        self._taken = (0, 0.0)
        self._activations: dict[str, int] = {}
        self._copy_bps = _DEFAULT_COPY_BPS
        self._window_plan: tuple[int, tuple[tuple[str, ...], ...]] | None = None
        """``(start, plan)``: the schedule slots of the current window are captured with."""

    # ------------------------------------------------------------------ capture
    def capture(self, step: int, trainer: Any, step_seconds: float) -> int:
        """Capture slot ``step % W`` of ``trainer``'s state after ``step`` completed steps; returns bytes.

        Raises:
            SidecarError: the sidecar is gone (the training loop's recovery handles it).
        """
        t0 = time.perf_counter()
        for name, n in trainer.expert_activations().items():
            self._activations[name] = self._activations.get(name, 0) + n
        index = step % self.window
        start = step - index
        if index == 0:
            self._plan(trainer, step_seconds, start)
        elif self._window_plan is None or self._window_plan[0] != start:
            self._adopt(start)  # a new process inside a window goes on with the window's schedule
            if self._window_plan is None or self._window_plan[0] != start:
                return 0  # the window's schedule is unknown: this window stays incomplete here
        slots = self._window_plan[1]
        record = SlotRecord(start, self.window, index, tuple(slots[index]),
                            tuple(n for s in slots[index + 1 :] for n in s), slots)
        _, members = trainer.sparse_operators()
        entries = slot_entries(trainer.state(), record, members, compute_dtype=_compute_dtype(trainer))
        packed = pack_slot(entries, record, job=self.job, layout=self.layout, rank=self.rank, rules=self.rules)
        packed_s = time.perf_counter() - t0
        if packed_s > 0:
            self._copy_bps = len(packed) / packed_s
        self._client().put_log(LogKey(step, 0, self.stage, "slot"), packed)
        self.bytes_captured += len(packed)
        self.seconds += time.perf_counter() - t0
        return len(packed)

    def _adopt(self, start: int) -> None:
        """Take the schedule of the window starting at ``start`` from its slot 0 (held by this
        sidecar, a peer or L2); leaves it unknown when that slot is not available."""
        try:
            data = self._client().get_log(LogKey(start, 0, self.stage, "slot"), rank=self.rank)
            record = slot_record(data)
        except LifelineError:
            return
        if record.plan and record.start == start:
            self._window_plan = (start, record.plan)

    def _plan(self, trainer: Any, step_seconds: float, start: int) -> None:
        """Plan the window starting now: MoEvement's order over the last window's activation counts,
        the most operators per slot within the budget, stretched to W. When even one operator per
        slot exceeds the budget for W steps, W stays (every rank must use the same W) and the
        slots cost stall: :attr:`over_budget` says so."""
        ops, _ = trainer.sparse_operators(self._activations)
        budget = max(1, budget_bytes(max(step_seconds, 1e-6), self._copy_bps))
        frozen = _compute_dtype(trainer)
        per_param = min(4, frozen.itemsize) if frozen is not None and frozen.is_floating_point else 4
        planned = plan_window(ops, budget_bytes=budget, compute_bytes_per_param=per_param)
        self.over_budget = planned.window > self.window
        base = plan_window(ops, budget_bytes=_UNBOUNDED, compute_bytes_per_param=per_param) if self.over_budget \
            else planned
        self.schedule = with_window(base, self.window)
        self._window_plan = (start, tuple(tuple(s) for s in self.schedule.slots))
        self._activations = {}

    def take_counts(self) -> dict[str, float]:
        """Slot bytes and seconds since the previous call (per-step reporting)."""
        out = {"slot_bytes": self.bytes_captured - self._taken[0],
               "slot_seconds": round(self.seconds - self._taken[1], 6)}
        self._taken = (self.bytes_captured, self.seconds)
        return out

    # ------------------------------------------------------------------ restore and replay
    def restore(self, step: int, trainer: Any) -> SlotRecord:
        """Load slot 0 of the window starting at ``step`` into ``trainer`` (ACTIVE operators whole,
        FROZEN ones' weights, data position, RNG). Raises :class:`RecoveryError` when ``step`` is
        not a window start or its slot is not held (by this sidecar or the peer holding its copy)."""
        if step % self.window:
            raise RecoveryError(f"step {step} is not the start of a window of {self.window} steps",
                                job=self.job, rank=self.rank, step=step)
        return self._load(step, trainer)

    def apply(self, step: int, start: int, trainer: Any) -> SlotRecord | None:
        """After replaying ``step``: apply its slot when it lies in the window starting at ``start``
        (``start < step < start + W``); ``None`` past the window (every operator is ACTIVE)."""
        if not start < step < start + self.window:
            return None
        return self._load(step, trainer)

    def catch_up(self, step: int, trainer: Any) -> None:
        """After re-running ``step`` from a window restored by every rank (:attr:`converting`): apply
        its slot while inside the window; the state is dense again from the window's last slot on."""
        if self.converting is None:
            return
        if self.apply(step, self.converting, trainer) is None or step == self.converting + self.window - 1:
            self.converting = None

    def _load(self, step: int, trainer: Any) -> SlotRecord:
        try:
            data = self._client().get_log(LogKey(step, 0, self.stage, "slot"), rank=self.rank)
        except LifelineError as err:
            raise RecoveryError(f"sparse slot of step {step} is not available: {err}", job=self.job,
                                rank=self.rank, step=step) from err
        # a trainer whose restore template differs from its state (optimizer moments not there before the
        # first step: a restarted process) gives the template, as a dense restore does
        full: dict[str, Any] = dict(trainer.restore_state() if isinstance(trainer, ProvidesRestoreState)
                                    else trainer.state())
        record = unpack_slot(data, full, layout=self.layout, rank=self.rank, rules=self.rules)
        if record.step != step:
            raise RecoveryError(f"the slot stored for step {step} is of step {record.step}", job=self.job,
                                rank=self.rank, step=step)
        trainer.load_state(full)
        if record.plan:  # captures inside this window go on with its schedule
            self._window_plan = (record.start, record.plan)
        return record


def _compute_dtype(trainer: Any) -> torch.dtype | None:
    """The trainer's ``compute_dtype`` (FROZEN weights are stored in it), ``None`` when it has none."""
    dtype = getattr(trainer, "compute_dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def window_start(step: int, window: int) -> int:
    """The start of the window step ``step`` belongs to (a multiple of ``window``)."""
    return step - step % max(1, window)

