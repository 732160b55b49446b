"""MoEvement's sparse-checkpoint schedule (pure).

Gandhi and Kozyrakis, "Sparse Checkpointing for Fast and Reliable MoE Training" (MoEvement),
NSDI '26, arXiv 2412.15411, §4 and Algorithm 1. A pipeline stage's state is cut into
**operators** (each expert of each MoE layer, each router, the stage's non-expert parameters).
A **window** of W steps captures every operator ACTIVE exactly once (fp32 weights + both Adam
moments, 12 B/param); at each earlier step of the window it is captured FROZEN (its compute
weights only), which is what replaying the window needs before the operator is promoted.
MoEvement's order puts the least popular experts first, routers and non-expert parameters
last. A slot (one step of the window) is priced as its ACTIVE bytes plus the FROZEN bytes of
every operator still to come; the schedule puts as many operators per slot as the per-step
budget (step time x copy bandwidth into the arena) allows. Every rank must use the same W
(all-reduce MAX, then :func:`with_window`); :func:`needs_replan` says when popularity or step
time drifted enough to plan again at a window boundary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from itertools import accumulate
from typing import Literal

from lifeline.errors import ConfigError


def integer(field: str, value: int, minimum: int = 0) -> int:
    """``value`` when it is an integer >= ``minimum`` (else :class:`ConfigError` naming ``field``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field} must be an integer >= {minimum}, got {value!r}", field=field)
    return value


def positive(field: str, value: float) -> float:
    """``value`` as a float when it is a finite number > 0 (else :class:`ConfigError`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{field} must be a positive finite number, got {value!r}", field=field)
    return float(value)

__all__ = [
    "ACTIVE_BYTES_PER_PARAM",
    "Operator",
    "SlotCost",
    "WindowSchedule",
    "agree_window",
    "budget_bytes",
    "needs_replan",
    "plan_window",
    "with_window",
]

ACTIVE_BYTES_PER_PARAM = 12
"""fp32 master weights + Adam's first and second moments: 3 x 4 bytes per parameter."""

OperatorKind = Literal["expert", "router", "dense"]
_KIND_RANK = {"expert": 0, "router": 1, "dense": 2}
_EXPERT_DRIFT = Fraction(1, 10)  # an expert "changed" when its count moved by more than 10 %
_EXPERTS_DRIFTED = Fraction(1, 4)  # ... and re-plan when at least 25 % of the experts changed
_STEP_DRIFT = Fraction(1, 10)  # or when the step time moved by more than 10 %


@dataclass(frozen=True)
class Operator:
    """One schedulable operator of a pipeline stage.

    Attributes:
        name: unique within the stage (e.g. ``"layers.3.experts.5"``).
        params: number of parameters, >= 0.
        kind: ``"expert"`` (one expert of one MoE layer), ``"router"`` (a layer's gate) or
            ``"dense"`` (the stage's non-expert parameters).
        layer: the MoE layer index, ``None`` for dense.
        activations: tokens routed to this expert over the rolling popularity window, >= 0
            (0 for routers and dense: they are scheduled last whatever it says).

    Raises:
        ConfigError: an empty name, an unknown kind, negative params or activations.
    """

    name: str
    params: int
    kind: OperatorKind
    layer: int | None = None
    activations: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"an operator needs a non-empty name, got {self.name!r}", field="name")
        integer("params", self.params)
        integer("activations", self.activations)
        if self.kind not in _KIND_RANK:
            raise ConfigError(f"kind must be 'expert', 'router' or 'dense', got {self.kind!r} ({self.name})",
                              field="kind")
        if self.layer is not None:
            integer("layer", self.layer)


@dataclass(frozen=True)
class SlotCost:
    """Bytes one slot of a window copies into the arena (MoEvement §4).

    ACTIVE operators cost :data:`ACTIVE_BYTES_PER_PARAM` (12) bytes per parameter, FROZEN ones
    ``compute_bytes_per_param`` (4 for fp32 compute weights, 2 for bf16).

    Raises:
        ConfigError: ``compute_bytes_per_param`` not an integer in [1, 12].
    """

    compute_bytes_per_param: int = 4

    def __post_init__(self) -> None:
        c = self.compute_bytes_per_param
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= ACTIVE_BYTES_PER_PARAM:
            raise ConfigError(f"compute_bytes_per_param must be an integer in [1, 12] (4 for fp32, 2 for bf16), "
                              f"got {c!r}", field="compute_bytes_per_param")

    def slot(self, active_params: int, frozen_params: int) -> int:
        """Bytes of a slot with ``active_params`` ACTIVE and ``frozen_params`` FROZEN parameters."""
        return ACTIVE_BYTES_PER_PARAM * active_params + self.compute_bytes_per_param * frozen_params


@dataclass(frozen=True)
class WindowSchedule:
    """A window: which operators are captured ACTIVE at each of its W steps.

    Attributes:
        slots: ``slots[i]`` names the operators captured ACTIVE at step ``i`` of the window
            (``0 <= i < window``); concatenated they are :attr:`order`, each operator once.
            A slot may be empty (a window stretched by :func:`with_window` past the operator count).
        operators: the operators in schedule order (least popular expert first).
        budget_bytes: the per-step budget the schedule was planned for, bytes.
        cost: the pricing of a slot.

    Raises:
        ConfigError: slots that do not list ``operators`` in order, each exactly once.
    """

    slots: tuple[tuple[str, ...], ...]
    operators: tuple[Operator, ...]
    budget_bytes: int
    cost: SlotCost = SlotCost()

    def __post_init__(self) -> None:
        names = self.order
        if not self.slots or tuple(n for s in self.slots for n in s) != names or len(set(names)) != len(names):
            raise ConfigError("slots must list the operators in schedule order, each exactly once", field="slots")
        integer("budget_bytes", self.budget_bytes, 1)

    @property
    def window(self) -> int:
        """W, the number of steps (slots) of the window."""
        return len(self.slots)

    @property
    def order(self) -> tuple[str, ...]:
        """Operator names in schedule order."""
        return tuple(op.name for op in self.operators)

    @property
    def over_budget(self) -> bool:
        """True when the most expensive slot exceeds :attr:`budget_bytes` (checkpointing goes on)."""
        return self.max_slot_bytes > self.budget_bytes

    @property
    def max_slot_bytes(self) -> int:
        """Bytes of the most expensive slot."""
        return max(self._bytes)

    def active_slot(self, name: str) -> int:
        """The slot (step of the window, 0-based) at which operator ``name`` is captured ACTIVE.

        Raises:
            ConfigError: no operator of that name.
        """
        try:
            return self._slot_of[name]
        except KeyError:
            raise ConfigError(f"no operator named {name!r} in this schedule", field="name") from None

    def frozen(self, i: int) -> tuple[str, ...]:
        """Operators captured FROZEN at step ``i`` of the window: those not yet ACTIVE (slot > i).

        Raises:
            ConfigError: ``i`` outside ``[0, window)``.
        """
        return self.order[self._ends[self._check(i)]:]

    def bytes_at(self, i: int) -> int:
        """Bytes captured at step ``i`` of the window (ACTIVE at 12 B/param + FROZEN).

        Raises:
            ConfigError: ``i`` outside ``[0, window)``.
        """
        return self._bytes[self._check(i)]

    def _check(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.window:
            raise ConfigError(f"slot must be in [0, {self.window}), got {i!r}", field="slot")
        return i

    @cached_property
    def _slot_of(self) -> dict[str, int]:
        return {name: i for i, slot in enumerate(self.slots) for name in slot}

    @cached_property
    def _ends(self) -> tuple[int, ...]:
        return tuple(accumulate(len(s) for s in self.slots))

    @cached_property
    def _bytes(self) -> tuple[int, ...]:
        suffix = _suffix_params(self.operators)
        starts = (0, *self._ends[:-1])
        return tuple(self.cost.slot(suffix[a] - suffix[b], suffix[b]) for a, b in zip(starts, self._ends))


def _suffix_params(ordered: Sequence[Operator]) -> list[int]:
    suffix = [0] * (len(ordered) + 1)
    for i in range(len(ordered) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + ordered[i].params
    return suffix


def _ordered(operators: Iterable[Operator]) -> tuple[Operator, ...]:
    ops = tuple(operators)
    if not ops:
        raise ConfigError("operators is empty: pass every expert, router and the dense part of the stage",
                          field="operators")
    seen: set[str] = set()
    for op in ops:
        if not isinstance(op, Operator):
            raise ConfigError(f"operators must be Operator values, got {type(op).__name__}", field="operators")
        if op.name in seen:
            raise ConfigError(f"duplicate operator name {op.name!r}: names must be unique in a stage",
                              field="operators")
        seen.add(op.name)
    # MoEvement §4: least popular experts first, routers and non-expert parameters last.
    return tuple(sorted(ops, key=lambda o: (_KIND_RANK[o.kind], o.activations if o.kind == "expert" else 0, o.name)))


def plan_window(operators: Iterable[Operator], *, budget_bytes: int, compute_bytes_per_param: int = 4) -> WindowSchedule:
    """Plan a window (MoEvement Algorithm 1): the most operators per slot that fit the budget.

    Operators are ordered least popular expert first (ascending ``activations``, ties by
    name), then routers, then dense (each by name). For ``k`` operators per slot, slot ``i``
    holds ``order[i*k:(i+1)*k]`` ACTIVE and every later operator FROZEN; the largest ``k``
    whose most expensive slot fits ``budget_bytes`` wins, and ``W = ceil(n / k)``. When no
    ``k`` fits, ``k = 1`` and :attr:`WindowSchedule.over_budget` is True: a checkpoint is
    never skipped, the overrun shows up as stall.

    Args:
        operators: every operator of the stage (any order).
        budget_bytes: bytes the trainer may copy per step, > 0 (see :func:`budget_bytes`).
        compute_bytes_per_param: FROZEN bytes per parameter, 4 (fp32) or 2 (bf16).

    Raises:
        ConfigError: empty ``operators``, duplicate names, a non-positive budget, bad
            ``compute_bytes_per_param``.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ConfigError(f"budget_bytes must be a positive integer (step seconds x copy bytes/s), got {budget_bytes!r}",
                          field="budget_bytes")
    cost = SlotCost(compute_bytes_per_param)
    order = _ordered(operators)
    n, suffix = len(order), _suffix_params(order)

    def most_expensive(k: int) -> int:
        return max(cost.slot(suffix[a] - suffix[min(a + k, n)], suffix[min(a + k, n)]) for a in range(0, n, k))

    k = next((k for k in range(n, 0, -1) if most_expensive(k) <= budget_bytes), 1)
    slots = tuple(tuple(op.name for op in order[a : a + k]) for a in range(0, n, k))
    return WindowSchedule(slots, order, budget_bytes, cost)


def budget_bytes(step_seconds: float, copy_bytes_per_second: float) -> int:
    """Per-step copy budget, bytes: measured step time (s) x measured copy bandwidth into the arena (B/s), floored.

    Raises:
        ConfigError: a non-positive or infinite argument.
    """
    return math.floor(positive("step_seconds", step_seconds) * positive("copy_bytes_per_second", copy_bytes_per_second))


def agree_window(windows: Sequence[int]) -> int:
    """The window every rank uses: the largest planned W (what an all-reduce MAX returns).

    Raises:
        ConfigError: no windows, or a window < 1.
    """
    if not windows:
        raise ConfigError("windows is empty: pass every rank's planned W", field="windows")
    for w in windows:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ConfigError(f"every window must be an integer >= 1, got {w!r}", field="windows")
    return max(windows)


def with_window(schedule: WindowSchedule, window: int) -> WindowSchedule:
    """Stretch ``schedule`` to ``window`` steps: the same order spread over more, smaller slots.

    ``n`` operators over ``w`` slots: ``n // w`` per slot, the ``n % w`` slots at the end
    taking one more (later slots carry fewer FROZEN bytes); when ``w > n`` the first ``n``
    slots take one operator each and the rest are empty. ``window == schedule.window``
    returns ``schedule`` itself. Deterministic: same inputs, same slots on every rank.

    Raises:
        ConfigError: ``window`` smaller than ``schedule.window`` (a window never shrinks: the
            slots would exceed the budget) or not an integer.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < schedule.window:
        raise ConfigError(f"window must be an integer >= the schedule's {schedule.window}, got {window!r}; "
                          "agree on the largest W (agree_window)", field="window")
    if window == schedule.window:
        return schedule
    n = len(schedule.operators)
    q, r = divmod(n, window)
    sizes = [1] * n + [0] * (window - n) if q == 0 else [q] * (window - r) + [q + 1] * r
    slots = tuple(schedule.order[end - size : end] for size, end in zip(sizes, accumulate(sizes)))
    return WindowSchedule(slots, schedule.operators, schedule.budget_bytes, schedule.cost)


def needs_replan(
    previous_counts: Mapping[str, int], counts: Mapping[str, int], previous_step_seconds: float, step_seconds: float
) -> bool:
    """Whether to plan again at the next window boundary (MoEvement's thresholds).

    True when at least 25 % of the experts changed their activation count by more than 10 %
    (an expert present in only one of the mappings counts as changed; one whose count was 0
    changed when it is now > 0), or when the step time changed by more than 10 %. Exact
    arithmetic: a change of exactly 10 % is not a change.

    Args:
        previous_counts, counts: expert name -> tokens routed over the rolling window, at the
            last plan and now.
        previous_step_seconds, step_seconds: mean step time at the last plan and now, > 0.

    Raises:
        ConfigError: a negative or non-integer count, a non-positive step time.
    """
    prev_s = Fraction(positive("previous_step_seconds", previous_step_seconds))
    now_s = Fraction(positive("step_seconds", step_seconds))
    for field, mapping in (("previous_counts", previous_counts), ("counts", counts)):
        for value in mapping.values():
            integer(field, value)
    if abs(now_s - prev_s) > _STEP_DRIFT * prev_s:
        return True
    experts = set(previous_counts) | set(counts)
    changed = sum(
        1
        for e in experts
        if e not in previous_counts
        or e not in counts
        or abs(counts[e] - previous_counts[e]) > _EXPERT_DRIFT * previous_counts[e]
    )
    return bool(experts) and changed >= _EXPERTS_DRIFTED * len(experts)
