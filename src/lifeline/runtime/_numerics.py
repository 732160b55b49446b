"""The numerics check of every step: NaN and loss spikes stop the update, a re-run tells a bad batch
from a faulty rank (docs/numerics.md; after Megatron-LM's rerun state machine,
``megatron/core/rerun_state_machine.py``).

:class:`NumericsGuard` wraps ``trainer.train_step()`` of a trainer that offers
:class:`~lifeline.runtime._hooks.ChecksNumerics`. In the trainer's ``before_update`` (gradients final,
optimizer update not yet applied) every rank reads the step's ``(loss, grad_norm)``, applies
:class:`SpikeRule` and the ranks agree with one ``all_reduce`` (float64, ``2 × world``): a NaN on one
rank stops the update on all of them, before anything reaches the weights. A stopped step is
abandoned (the state is still the last completed step's) and run again on the same batch:

* bad again with the same numbers on every rank (same bits): a bad batch — skipped
  (``trainer.skip_batch()``: no update, step counter and data position advance as a failure-free run
  that skips it), reported as a ``skipped_batch`` event;
* clean, or bad with other numbers: the first try's numbers did not come from the batch — a faulty
  rank, reported as a ``faulty_rank`` event naming the ranks whose check failed on the first try; when
  those are some ranks only, they raise :class:`FaultyRankError` after the step (their trainers exit,
  the engine replaces them). A clean re-run's update is kept; a bad one's batch is skipped.

``spec.recovery.lossSpike.skipSteps`` (:data:`NUMERICS_ENV`) skips steps unchecked, as a detected bad
batch is: the failure-free reference of a run that skipped them. The ``nan`` fault of ``lifeline run``
(:data:`NAN_ENV`, set by :mod:`lifeline.launch._poison`) poisons this rank's numbers at a step.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifeline.errors import ConfigError, LifelineError
from lifeline.runtime._hooks import ChecksNumerics

__all__ = ["NUMERICS_ENV", "NAN_ENV", "SpikeRule", "NumericsGuard", "SkippedStep", "BadStep", "FaultyRankError",
           "parse_poison", "verdict", "guard_for", "checked_step"]

NUMERICS_ENV = "LIFELINE_NUMERICS"
"""JSON of ``spec.recovery.lossSpike`` (``enabled``, ``factor``, ``window``, ``skipSteps``); empty: defaults."""
NAN_ENV = "LIFELINE_FAULT_NAN"
"""This rank's ``nan`` faults: comma-separated ``S`` or ``S:transient`` (:mod:`lifeline.launch._poison`)."""
NAN_DIR_ENV = "LIFELINE_FAULT_HOLD_DIR"
"""Where a transient ``nan`` leaves ``nan-<step>`` once it fired: it fires once per run, not again in a
restarted trainer (the launcher's per-rank fault directory, :mod:`lifeline.runtime._hold`'s)."""

OK, SPIKE, NAN = 0, 1, 2
_REASONS = {SPIKE: "spike", NAN: "nan"}


@dataclass(frozen=True)
class SpikeRule:
    """A loss above ``factor`` × the median of the ``window`` losses before it is a spike (checked once
    ``window`` losses are known). ``factor`` > 1; ``window`` >= 1 steps."""

    factor: float = 10.0
    window: int = 20


def verdict(loss: float | None, grad_norm: float | None, history: Sequence[float], rule: SpikeRule | None) -> int:
    """The check of one step on one rank: :data:`NAN` when ``loss`` or ``grad_norm`` is non-finite, else
    :data:`SPIKE` when ``rule`` is set, ``history`` (earlier steps' losses, oldest first) holds at least
    ``rule.window`` of them and ``loss > rule.factor × median(last window)``, else :data:`OK`. ``None``
    values are not checked (a rank without a loss)."""
    if any(v is not None and not math.isfinite(v) for v in (loss, grad_norm)):
        return NAN
    if rule is not None and loss is not None and len(history) >= rule.window:
        if loss > rule.factor * statistics.median(history[-rule.window:]):
            return SPIKE
    return OK


def parse_poison(raw: str) -> dict[int, bool]:
    """``"5,9:transient"`` -> ``{5: False, 9: True}`` (step -> transient); a malformed entry is ignored
    (fault injection never stops a trainer)."""
    out: dict[int, bool] = {}
    for part in raw.split(","):
        step, _, mode = part.strip().partition(":")
        try:
            out[int(step)] = mode == "transient"
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class SkippedStep:
    """The report of a skipped step (a :class:`~lifeline.runtime.StepReport`): ``step`` completed steps
    after it, no loss, no tokens, ``seconds`` of wall time (its tries included)."""

    step: int
    seconds: float
    loss: float | None = None
    tokens: int = 0


class BadStep(Exception):
    """Raised from ``before_update`` to stop a step whose check failed on some rank (every rank raises it).

    Attributes:
        step: the step (1-based). reason: ``"nan"`` or ``"spike"``. ranks: the ranks whose check failed.
        differs: on a re-run, some rank's numbers differ from its first try.
    """

    def __init__(self, step: int, reason: str, ranks: tuple[int, ...], differs: bool) -> None:
        super().__init__(f"step {step}: {reason} on ranks {list(ranks)}")
        self.step, self.reason, self.ranks, self.differs = step, reason, ranks, differs


class FaultyRankError(LifelineError):
    """This rank's numbers of a step were bad on the first try and not on its re-run: a faulty rank
    (its trainer exits so that the engine replaces it)."""


def _bits(value: float | None) -> int | None:
    """The IEEE-754 bits of ``value`` (NaNs of one computation compare equal), ``None`` for ``None``."""
    return None if value is None else struct.unpack("<q", struct.pack("<d", value))[0]


def _all_reduce(flags: torch.Tensor) -> torch.Tensor:
    """Sum ``flags`` (float64 ``(2 × world,)``) over the default process group (none: as is)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags)
    return flags


class NumericsGuard:
    """The numerics check of one rank (see the module docstring).

    Args:
        report: ``report(event, **fields)`` (``RuntimeContext.report``).
        rule: the spike rule; ``None``: only non-finite values stop a step.
        skip_steps: steps skipped unchecked (``spec.recovery.lossSpike.skipSteps``).
        poison: step -> transient, this rank's ``nan`` faults.
        marks: the directory of the fired transient faults' ``nan-<step>`` markers (``None``: this process only).
        agree: sums the flags over the ranks (default: ``all_reduce`` on the default group).
        world: ``() -> (rank, world size)`` in that group (default: ``torch.distributed``'s, else ``(0, 1)``).
    """

    def __init__(self, report: Callable[..., None], rule: SpikeRule | None = SpikeRule(),
                 skip_steps: Sequence[int] = (), poison: Mapping[int, bool] | None = None,
                 agree: Callable[[torch.Tensor], torch.Tensor] = _all_reduce,
                 world: Callable[[], tuple[int, int]] | None = None, marks: Path | None = None) -> None:
        self.report, self.rule, self.skip_steps = report, rule, frozenset(skip_steps)
        self.poison, self.marks, self._fired = dict(poison or {}), marks, set[int]()
        self.agree, self.world = agree, world or _dist_world
        self.losses: dict[int, float] = {}
        """step -> its loss (finite, trained steps only): the spike rule's history."""
        self.checks = 0
        """Checks run (``before_update`` calls), for tests and the overhead measurement."""
        self._attempt = 0
        self._first: tuple[int | None, int | None] = (None, None)

    @classmethod
    def from_env(cls, report: Callable[..., None], env: Mapping[str, str] | None = None) -> NumericsGuard | None:
        """The guard :data:`NUMERICS_ENV` and :data:`NAN_ENV` describe; ``None`` when the check is disabled.

        Raises:
            ConfigError: :data:`NUMERICS_ENV` is not a JSON object.
        """
        env = os.environ if env is None else env
        raw = env.get(NUMERICS_ENV, "").strip()
        spec: dict[str, Any] = json.loads(raw) if raw else {}
        if not isinstance(spec, dict):
            raise ConfigError(f"{NUMERICS_ENV} must be a JSON object, not {raw!r}", field=NUMERICS_ENV)
        if not spec.get("enabled", True):
            return None
        rule = SpikeRule(float(spec.get("factor", 10.0)), int(spec.get("window", 20)))
        marks = env.get(NAN_DIR_ENV, "").strip()
        return cls(report, rule, [int(s) for s in spec.get("skipSteps", [])], parse_poison(env.get(NAN_ENV, "")),
                   marks=Path(marks) if marks else None)

    def history(self, step: int) -> list[float]:
        """The losses of the trained steps before ``step``, oldest first (the last ``window`` of them)."""
        keep = self.rule.window if self.rule is not None else 0
        return [self.losses[s] for s in sorted(s for s in self.losses if s < step)][-keep:] if keep else []

    def train_step(self, trainer: Any) -> Any:
        """Run ``trainer``'s next step under the check; returns its report, or a :class:`SkippedStep`.

        Raises:
            FaultyRankError: this rank's first try was bad and its re-run was not (after the step).
            Whatever ``trainer.train_step()`` raises (a collective error of a peer's failure).
        """
        step, start = trainer.step + 1, time.perf_counter()
        if step in self.skip_steps:
            return self._skip(trainer, step, start, "configured", ())
        before = trainer.before_update
        trainer.before_update = lambda: self._check(trainer, before, step)
        try:
            self._attempt = 0
            try:
                result = trainer.train_step()
            except BadStep as bad:
                first = bad
                trainer.abandon_step()
            else:
                self._remember(step, result.loss)
                return result
            self._attempt = 1
            try:
                result = trainer.train_step()
            except BadStep as again:
                trainer.abandon_step()
                if again.differs:
                    self._faulty(step, first)
                return self._skip(trainer, step, start, first.reason, first.ranks)
            self._remember(step, result.loss)
            self._faulty(step, first)
            return result
        finally:
            trainer.before_update = before

    def _check(self, trainer: Any, before: Callable[[], None] | None, step: int) -> None:
        """``before_update`` of a checked step: the trainer's own hook first, then the check (raises
        :class:`BadStep` on every rank when it failed on any)."""
        if before is not None:
            before()
        self.checks += 1
        loss, grad_norm = trainer.step_numerics()
        if self._poisoned(step):
            loss = grad_norm = math.nan  # the injected fault: this rank's batch of the step is poisoned
        code = verdict(loss, grad_norm, self.history(step), self.rule)
        rank, world = self.world()
        mine = (_bits(loss), _bits(grad_norm))
        flags = torch.zeros(2 * world, dtype=torch.float64)
        flags[rank] = code
        if self._attempt == 0:
            self._first = mine
        else:
            flags[world + rank] = float(mine != self._first)
        flags = self.agree(flags)
        codes = flags[:world].tolist()
        if any(codes):
            raise BadStep(step, _REASONS[int(max(codes))], tuple(r for r, c in enumerate(codes) if c),
                          bool(flags[world:].sum() > 0))

    def _poisoned(self, step: int) -> bool:
        """Whether an injected ``nan`` poisons this try of ``step``: every try, or a transient one's very
        first try in the run (marked fired in :attr:`marks`, so a restarted trainer's re-run is clean)."""
        if step not in self.poison:
            return False
        if not self.poison[step]:
            return True
        marker = None if self.marks is None else self.marks / f"nan-{step}"
        if self._attempt != 0 or step in self._fired or (marker is not None and marker.exists()):
            return False
        self._fired.add(step)
        if marker is not None:
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            except OSError:  # fault injection never stops a trainer
                pass
        return True

    def _remember(self, step: int, loss: float | None) -> None:
        if loss is not None and math.isfinite(loss):
            self.losses[step] = loss
            if self.rule is not None and len(self.losses) > 4 * self.rule.window:  # bounded: drop the oldest
                for s in sorted(self.losses)[: len(self.losses) - 2 * self.rule.window]:
                    del self.losses[s]

    def _skip(self, trainer: Any, step: int, start: float, reason: str, ranks: tuple[int, ...]) -> SkippedStep:
        trainer.skip_batch()
        if trainer.step != step:
            raise LifelineError(f"skip_batch() left the trainer at step {trainer.step}, not {step}", step=step)
        self.report("skipped_batch", step=step, reason=reason, ranks=list(ranks))
        return SkippedStep(step, time.perf_counter() - start)

    def _faulty(self, step: int, first: BadStep) -> None:
        """Report the ranks whose check failed on the first try only; those raise when not all failed."""
        rank, world = self.world()
        self.report("faulty_rank", step=step, reason=first.reason, ranks=list(first.ranks))
        if rank in first.ranks and len(first.ranks) < world:
            raise FaultyRankError(f"step {step}: this rank's {first.reason} did not recur on the re-run (a faulty "
                                  "rank, not a bad batch)", rank=rank, step=step)


def guard_for(ctx: Any) -> NumericsGuard | None:
    """The guard of a rank's :class:`~lifeline.runtime.RuntimeContext`: ``ctx.settings.numerics``
    (:data:`NUMERICS_ENV`) and this process's :data:`NAN_ENV`; ``None`` when the check is disabled.

    Raises:
        ConfigError: the settings' JSON is not an object.
    """
    env = {NUMERICS_ENV: getattr(ctx.settings, "numerics", "") or "", NAN_ENV: os.environ.get(NAN_ENV, ""),
           NAN_DIR_ENV: os.environ.get(NAN_DIR_ENV, "")}
    return NumericsGuard.from_env(ctx.report, env)


def checked_step(guard: NumericsGuard | None, trainer: Any, *skip_when: object) -> Any:
    """``guard.train_step(trainer)`` when there is a guard, the trainer offers
    :class:`~lifeline.runtime._hooks.ChecksNumerics` and every ``skip_when`` is ``None`` (an upstream log
    or sparse windows record each try: not combined); else ``trainer.train_step()``."""
    if guard is None or any(x is not None for x in skip_when) or not isinstance(trainer, ChecksNumerics):
        return trainer.train_step()
    return guard.train_step(trainer)


def _dist_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
