"""``spec.recovery.straggler``: straggler detection from the ranks' compute times (docs/stragglers.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lifeline.api._base import WireModel

__all__ = ["StragglerAction", "StragglerRecord", "StragglerSpec"]

StragglerAction = Literal["report", "replace"]
"""What happens to a straggler: reported only, or its pod moved to another node."""


class StragglerSpec(WireModel):
    """A rank whose compute time per step (its step minus its wait in the collectives) is above
    ``threshold`` × the median of the other ranks', over the last ``window`` steps (the median of the
    per-step ratios), is a straggler: reported (an event, the run's summary), and with
    ``action: replace`` its pod is moved to another node and its node cooled down (relative and
    individual scores after NVIDIA Resiliency Extension's straggler detection; docs/stragglers.md)."""

    threshold: float = Field(
        1.5, gt=1, le=1000,
        description="A rank slower than threshold x the other ranks' median compute time is a straggler.",
    )
    window: int = Field(10, ge=1, le=10000, description="Steps judged: the median of their ratios decides.")
    action: StragglerAction = Field(
        "report",
        description="report: an event and the run's summary only; replace: also move the rank's pod to "
        "another node, its node cooled down (spec.recovery.nodeCooldownSeconds).",
    )


class StragglerRecord(WireModel):
    """A rank flagged as a straggler in the current generation (``status.stragglers``; docs/stragglers.md)."""

    rank: int = Field(ge=0, description="The global rank flagged.")
    generation: int = Field(ge=0, description="The generation it was flagged in.")
    relative: float = Field(ge=0, description="Its compute time per step / the other ranks' median (a slowdown).")
    individual: float = Field(ge=0, description="Its compute time per step / its own best (a slowdown).")
    compute_seconds: float = Field(ge=0, description="Its median compute seconds per step over the steps judged.")
    steps: list[int] = Field(default_factory=list, description="The first and last step judged.")
    node: str | None = Field(None, description="The node its pod ran on when flagged.")
    action: StragglerAction = Field(
        "report", description="report: reported only; replace: its pod was deleted to move it to another node.")
