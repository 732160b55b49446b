"""lifeline.control: pure decisions, no I/O (DESIGN.md "Failures"; docs/control.md).

- :func:`classify` - failure signals to :class:`Failure` values.
- :func:`plan_recovery` - the recovery ladder: a frozen :class:`RecoveryPlan`.
- :func:`place_replicas` - L1 replica placement (Gemini, SOSP'23 §4).
- :func:`checkpoint_interval`, :class:`AdaptiveInterval` - how often to checkpoint
  (Young 1974, Daly 2006, CheckFreq FAST'21).
- :func:`ettr`, :func:`expected_ettr` - effective training time ratio.
"""

from lifeline.api.trainingjob import RecoveryAction
from lifeline.control.ettr import EttrBreakdown, ettr, expected_ettr
from lifeline.control.failures import (
    EXIT_COLLECTIVE_ERROR,
    CollectiveErrorReported,
    ContainerTerminated,
    Failure,
    FailureKind,
    HeartbeatExpired,
    NodeCondition,
    PodGone,
    Signal,
    StepStalled,
    classify,
)
from lifeline.control.interval import AdaptiveInterval, checkpoint_interval, daly_interval, young_interval
from lifeline.control.placement import node_groups, place_replicas
from lifeline.control.plan import PodPlacement, RecoveryPlan, RestoreSource, plan_recovery
from lifeline.control.state import TIERS, ClusterState, Holding, JobState, NodeState, UpstreamLog, stage_of

__all__ = [
    "EXIT_COLLECTIVE_ERROR",
    "TIERS",
    "AdaptiveInterval",
    "ClusterState",
    "CollectiveErrorReported",
    "ContainerTerminated",
    "EttrBreakdown",
    "Failure",
    "FailureKind",
    "HeartbeatExpired",
    "Holding",
    "JobState",
    "NodeCondition",
    "NodeState",
    "PodGone",
    "PodPlacement",
    "RecoveryAction",
    "RecoveryPlan",
    "RestoreSource",
    "Signal",
    "StepStalled",
    "UpstreamLog",
    "checkpoint_interval",
    "classify",
    "daly_interval",
    "ettr",
    "expected_ettr",
    "node_groups",
    "place_replicas",
    "plan_recovery",
    "stage_of",
    "young_interval",
]
