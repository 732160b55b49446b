"""``spec.recovery.lossSpike``: the numerics check of every step (NaN and loss spikes, docs/numerics.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from lifeline.api._base import WireModel

__all__ = ["LossSpikeSpec"]


class LossSpikeSpec(WireModel):
    """A non-finite loss or gradient norm, or a loss above ``factor`` × the running median of the last
    ``window`` losses, stops the step before its optimizer update; the step is re-run from the state
    before it: the same numbers again mean a bad batch (skipped, recorded), different ones a faulty
    rank (docs/numerics.md; after Megatron-LM's rerun state machine)."""

    enabled: bool = Field(True, description="Check every step's loss and gradient norm before the update.")
    factor: float = Field(
        10.0, gt=1, le=1e6,
        description="A loss above factor x the running median of the last `window` losses is a spike.",
    )
    window: int = Field(
        20, ge=1, le=10000,
        description="Losses in the running median; the spike rule applies once this many steps trained.",
    )
    skip_steps: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, max_length=10000,
        description="Steps whose batch is skipped unchecked, as a detected bad batch is: the failure-free "
        "reference of a run that skipped them.",
    )

    @field_validator("skip_steps")
    @classmethod
    def _sorted_unique(cls, steps: list[int]) -> list[int]:
        return sorted(set(steps))
