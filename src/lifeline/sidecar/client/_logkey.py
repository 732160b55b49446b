"""The key of an upstream-log entry, shared by the trainer's client and the sidecar's log store."""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.errors import ConfigError

__all__ = ["LogKey", "DIRECTIONS"]

DIRECTIONS = ("fwd", "bwd", "norm", "slot")


@dataclass(frozen=True, slots=True)
class LogKey:
    """Key of one upstream-log entry.

    Attributes:
        iteration: training iteration (step) the tensor belongs to, >= 0.
        micro_batch: micro-batch index within the iteration, >= 0.
        stage: pipeline stage that sent the tensor, >= 0.
        direction: ``"fwd"`` (activation sent to stage+1), ``"bwd"`` (gradient sent to stage-1) or
            ``"norm"`` (the world's gradient sums of squares of the iteration, micro-batch 0) or
            ``"slot"`` (the rank's sparse-checkpoint slot of step ``iteration``, micro-batch 0;
            see :mod:`lifeline.checkpoint`'s slot format).
    """

    iteration: int
    micro_batch: int
    stage: int
    direction: str

    def __post_init__(self) -> None:
        for f in ("iteration", "micro_batch", "stage"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 0:
                raise ConfigError(f"upstream-log key {f} must be an int >= 0", field=f)
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"upstream-log key direction must be one of {DIRECTIONS}", field="direction")

    @property
    def name(self) -> str:
        """The store name: ``<micro_batch>/<stage>/<direction>`` (the iteration is the step)."""
        return f"{self.micro_batch}/{self.stage}/{self.direction}"

    def to_dict(self) -> dict:
        return {"iteration": self.iteration, "micro_batch": self.micro_batch, "stage": self.stage,
                "direction": self.direction}

    @classmethod
    def from_dict(cls, d: dict) -> LogKey:
        return cls(int(d["iteration"]), int(d["micro_batch"]), int(d["stage"]), str(d["direction"]))
