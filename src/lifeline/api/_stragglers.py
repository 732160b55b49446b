"""``spec.recovery.straggler``: straggler detection from the ranks' compute times (docs/stragglers.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lifeline.api._base import WireModel

__all__ = ["StragglerSpec"]


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
    action: Literal["report", "replace"] = Field(
        "report",
        description="report: an event and the run's summary only; replace: also move the rank's pod to "
        "another node, its node cooled down (spec.recovery.nodeCooldownSeconds).",
    )
