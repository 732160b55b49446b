"""``spec.recovery``: how failures are recovered (DESIGN.md "Failures"), with its nested checks.

Split from :mod:`lifeline.api.trainingjob` (which re-exports both names): the recovery settings are
one responsibility, and they grow with every failure kind (numerics, stragglers, node health).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from lifeline.api._base import WireModel, field_error
from lifeline.api._health import HealthCheckSpec
from lifeline.api._numerics import LossSpikeSpec
from lifeline.api._stragglers import StragglerSpec

__all__ = ["ElasticSpec", "RecoverySpec"]


class ElasticSpec(WireModel):
    """Elastic recovery: the job may continue at a smaller world size (fewer replica groups)."""

    min_replicas: int = Field(1, ge=1, description="Smallest world size the job may shrink to.")


class RecoverySpec(WireModel):
    """How failures are recovered (DESIGN.md "Failures")."""

    max_restarts: int = Field(10, ge=0, description="Recoveries allowed before the job is marked Failed.")
    hang_timeout_seconds: int = Field(300, ge=1, description="No step progress for this long is a hang.")
    elastic: ElasticSpec | None = Field(
        None, description="Allow resharding to a smaller world size; unset: fixed size."
    )
    node_cooldown_seconds: int = Field(
        600, ge=0, description="How long a node that failed a pod of this job is avoided."
    )
    localized_replay: bool = Field(
        False,
        description="Log tensors sent across pipeline boundaries so one failed stage can replay alone (MoEvement).",
    )
    heartbeat_seconds: float = Field(
        1.0, gt=0, le=60,
        description="Sidecar heartbeat period; a sidecar silent for three periods is lost (and a node none of "
        "whose sidecars beats).",
    )
    collective_grace_seconds: float = Field(
        5.0, ge=0, le=3600,
        description="How long a collective error reported alone waits for its cause (a dead peer, a silent "
        "sidecar) to show before it is acted on; at least three heartbeat periods.",
    )
    startup_grace_seconds: int = Field(
        60, ge=1, le=3600, description="How long a started sidecar may take to register before it counts as lost."
    )
    loss_spike: LossSpikeSpec = Field(
        default_factory=LossSpikeSpec,  # type: ignore[arg-type]
        json_schema_extra={"default": {}},
        description="NaN and loss-spike check of every step: a bad batch is skipped, a faulty rank reported "
        "(docs/numerics.md).",
    )
    straggler: StragglerSpec = Field(default_factory=StragglerSpec, json_schema_extra={"default": {}},  # type: ignore[arg-type]
                                     description="Straggler detection from the ranks' compute times (docs/stragglers.md).")
    health_check: HealthCheckSpec = Field(
        default_factory=HealthCheckSpec, json_schema_extra={"default": {}},  # type: ignore[arg-type]
        description="The nodes' compute and collective check before the job uses them (docs/health.md).")

    @model_validator(mode="after")
    def _grace_covers_heartbeat(self) -> RecoverySpec:
        if self.collective_grace_seconds < 3 * self.heartbeat_seconds:
            raise field_error(
                "spec.recovery.collectiveGraceSeconds",
                f"spec.recovery.collectiveGraceSeconds ({self.collective_grace_seconds:g}) must be at least three "
                f"heartbeat periods ({3 * self.heartbeat_seconds:g} s): a collective error must wait until a dead "
                f"peer's sidecar can be seen missing; raise it or lower spec.recovery.heartbeatSeconds",
            )
        return self
