"""``spec.recovery.healthCheck``: the nodes' check before the job uses them (docs/health.md)."""

from __future__ import annotations

from pydantic import Field

from lifeline.api._base import WireModel

__all__ = ["HealthCheckSpec"]


class HealthCheckSpec(WireModel):
    """Before a job places its first pods, every node it may use runs a short compute check (a fixed
    fp32 matmul chain: its result must equal the other nodes' and its time stay within ``threshold`` ×
    their median) and a collective check (a gloo all-reduce between neighbouring pairs of nodes: a node
    whose pairs both run below the median bandwidth ÷ ``threshold`` fails). A node that fails is never
    used by the job (after NVIDIA Resiliency Extension's health checks and DLRover's network check)."""

    enabled: bool = Field(False, description="Check the nodes before the job uses them.")
    threshold: float = Field(
        2.0, gt=1, le=100,
        description="A node slower than threshold x the median compute time, or whose pairs both reach less "
        "than the median all-reduce bandwidth / threshold, fails.",
    )
