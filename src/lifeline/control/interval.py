"""How often to checkpoint: Young/Daly's optimum and a CheckFreq-style adaptive policy (pure).

- Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
  ``T = sqrt(2 * C * M)`` for checkpoint cost ``C`` and mean time between failures ``M``.
- Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3), 2006, eq. (37): ``T = sqrt(2CM) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C``
  for ``C < 2M``, else ``T = M``. ``T`` is compute time between checkpoints.
- Mohan, Phanishayee, Chidambaram, "CheckFreq: Frequent, Fine-Grained DNN Checkpointing",
  FAST '21, §4: pick the checkpoint frequency from measured iteration time and checkpoint
  cost so that the stall stays within a fraction ``p`` of training time, keep the next
  snapshot from starting before the previous checkpoint finished, and re-tune as the
  measurements change.

For Lifeline, ``C`` is the trainer's stall per save (the memcpy into the arena plus any
backpressure wait, DESIGN.md invariant 5), not the time to replicate or persist, which runs
off the critical path in the sidecar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lifeline.errors import ConfigError

__all__ = ["young_interval", "daly_interval", "checkpoint_interval", "AdaptiveInterval"]


def _positive(name: str, value: float) -> None:
    if not value > 0 or math.isinf(value):
        raise ConfigError(f"{name} must be a positive finite number of seconds, got {value!r}", field=name)


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's (1974) optimum compute time between checkpoints, seconds: ``sqrt(2 C M)``.

    Raises:
        ConfigError: a non-positive or infinite argument.
    """
    _positive("save_seconds", save_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's (2006, eq. 37) higher-order optimum compute time between checkpoints, seconds.

    ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` when ``C < 2M``; ``M`` otherwise.

    Raises:
        ConfigError: a non-positive or infinite argument.
    """
    _positive("save_seconds", save_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    c, m = save_seconds, mtbf_seconds
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def checkpoint_interval(
    save_seconds: float,
    mtbf_seconds: float,
    *,
    step_seconds: float,
    min_steps: int = 1,
    max_steps: int | None = None,
    method: str = "daly",
) -> int:
    """The optimum interval between checkpoints in optimizer steps.

    Args:
        save_seconds: the trainer's stall per checkpoint, seconds.
        mtbf_seconds: mean time between failures of the whole job, seconds (for a job on
            ``n`` nodes of MTBF ``M_node`` each, about ``M_node / n``).
        step_seconds: seconds per optimizer step.
        min_steps, max_steps: bounds on the result (``max_steps=None``: unbounded).
        method: ``"daly"`` (default) or ``"young"``.

    Returns:
        ``round(T / step_seconds)`` clamped to ``[min_steps, max_steps]`` (at least 1).

    Raises:
        ConfigError: non-positive times, bad bounds or an unknown method.
    """
    _positive("step_seconds", step_seconds)
    if method not in ("daly", "young"):
        raise ConfigError(f"method must be 'daly' or 'young', got {method!r}", field="method")
    if min_steps < 1 or (max_steps is not None and max_steps < min_steps):
        raise ConfigError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}", field="min_steps")
    seconds = (daly_interval if method == "daly" else young_interval)(save_seconds, mtbf_seconds)
    steps = max(min_steps, round(seconds / step_seconds))
    return steps if max_steps is None else min(steps, max_steps)


@dataclass(frozen=True)
class AdaptiveInterval:
    """A CheckFreq-style (FAST '21 §4) adaptive checkpoint interval, as an immutable value.

    Each :meth:`observe` folds one measurement into exponentially weighted means and returns
    a new policy whose :attr:`steps` is the smallest interval ``k`` such that

    - the stall stays within the budget: ``stall / (k * step) <= overhead``;
    - the previous checkpoint drained before the next one starts: ``k * step >= drain``
      (``drain`` is the sidecar's time to replicate a checkpoint: waiting for it would show up
      as backpressure);
    - and, when ``mtbf_seconds`` is known, ``k`` is at least Daly's optimum in steps (beyond the
      budget, checkpointing more often only loses time to stalls);

    clamped to ``[min_steps, max_steps]``.

    Attributes:
        steps: the current interval, in steps.
        overhead: the stall budget ``p`` as a fraction of training time (CheckFreq's default
            profile targets a few percent).
        min_steps, max_steps: bounds on :attr:`steps`.
        smoothing: weight of a new measurement in the running means, in (0, 1].
        mtbf_seconds: the job's mean time between failures, if known.
        stall_seconds, step_seconds, drain_seconds: the running means (``None`` before the
            first measurement).
    """

    steps: int = 1
    overhead: float = 0.05
    min_steps: int = 1
    max_steps: int = 1000
    smoothing: float = 0.25
    mtbf_seconds: float | None = None
    stall_seconds: float | None = None
    step_seconds: float | None = None
    drain_seconds: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.overhead < 1:
            raise ConfigError(f"overhead must be in (0, 1), got {self.overhead}", field="overhead")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ConfigError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}",
                              field="min_steps")
        if not 0 < self.smoothing <= 1:
            raise ConfigError(f"smoothing must be in (0, 1], got {self.smoothing}", field="smoothing")

    def observe(self, *, stall_seconds: float, step_seconds: float, drain_seconds: float = 0.0) -> AdaptiveInterval:
        """Fold in one checkpoint's measurements (seconds) and return the re-tuned policy.

        Args:
            stall_seconds: the trainer's stall for this save (memcpy + backpressure wait), >= 0.
            step_seconds: the mean optimizer step time since the previous save, > 0.
            drain_seconds: the time the sidecar took to finish this checkpoint off the
                critical path (replicate to peers), >= 0.

        Raises:
            ConfigError: a negative stall or drain, or a non-positive step time.
        """
        _positive("step_seconds", step_seconds)
        if stall_seconds < 0 or drain_seconds < 0:
            raise ConfigError("stall_seconds and drain_seconds must be >= 0", field="stall_seconds")
        a = self.smoothing

        def mean(old: float | None, new: float) -> float:
            return new if old is None else (1 - a) * old + a * new

        stall = mean(self.stall_seconds, stall_seconds)
        step = mean(self.step_seconds, step_seconds)
        drain = mean(self.drain_seconds, drain_seconds)
        k = max(math.ceil(stall / (self.overhead * step) - 1e-9), math.ceil(drain / step - 1e-9), 1)
        if self.mtbf_seconds is not None and stall > 0:
            k = max(k, round(daly_interval(stall, self.mtbf_seconds) / step))
        k = min(max(k, self.min_steps), self.max_steps)
        return replace(self, steps=k, stall_seconds=stall, step_seconds=step, drain_seconds=drain)
