"""lifeline.control: pure decisions, no I/O (DESIGN.md "Failures"; docs/control.md).

- :func:`decide` - the decision engine of both runners (the operator and ``lifeline run``):
  an :class:`Observed` round and the job's :class:`Record` in, a :class:`Decision` out.
- :func:`classify` - failure signals to :class:`Failure` values.
- :func:`plan_recovery` - the recovery ladder: a frozen :class:`RecoveryPlan`.
- :func:`place_replicas` - L1 replica placement (Gemini, SOSP'23 §4).
- :func:`checkpoint_interval`, :class:`AdaptiveInterval` - how often to checkpoint
  (Young 1974, Daly 2006, CheckFreq FAST'21).
- :func:`ettr`, :func:`expected_ettr` - effective training time ratio; :func:`ettr_at_scale`,
  :func:`modeled_peers`, :func:`lifeline_costs`, :func:`ettr_table` - ETTR of a large job from
  each system's costs (CheckFreq, Gemini, MoEvement, ours).
- The sparse-checkpoint window schedule is planned by every rank from its own activation counts
  and step time: it lives in :mod:`lifeline.checkpoint` (docs/control.md says why).

The plan and the values it holds (:class:`RecoveryPlan`, :class:`Failure`, :class:`Holding` ...)
are wire documents defined in :mod:`lifeline.api.recovery`; they are re-exported here.
"""

from lifeline.api.recovery import TIERS, Failure, FailureKind, Holding, PodPlacement, RecoveryPlan, RestoreSource, Tier
from lifeline.api.trainingjob import RecoveryAction
from lifeline.control.engine import (
    SETTLE_SECONDS,
    CatalogFacts,
    Decision,
    Observed,
    Record,
    Settle,
    SidecarState,
    decide,
)
from lifeline.control.ettr import (
    EttrBreakdown,
    SystemCosts,
    ettr,
    ettr_at_scale,
    ettr_table,
    expected_ettr,
    lifeline_costs,
    modeled_peers,
    window_rework_seconds,
)
from lifeline.control.failures import (
    EXIT_COLLECTIVE_ERROR,
    CollectiveErrorReported,
    ContainerTerminated,
    HeartbeatExpired,
    NodeCondition,
    PodGone,
    Signal,
    StepStalled,
    TrainerSilent,
    classify,
)
from lifeline.control.interval import AdaptiveInterval, checkpoint_interval, daly_interval, young_interval
from lifeline.control.placement import node_groups, place_replicas
from lifeline.control.plan import plan_recovery
from lifeline.control.progress import Progress, Report
from lifeline.control.state import ClusterState, JobState, NodeState, StoredWindows, UpstreamLog, stage_of

__all__ = [
    "EXIT_COLLECTIVE_ERROR",
    "SETTLE_SECONDS",
    "TIERS",
    "AdaptiveInterval",
    "CatalogFacts",
    "ClusterState",
    "CollectiveErrorReported",
    "ContainerTerminated",
    "Decision",
    "EttrBreakdown",
    "Failure",
    "FailureKind",
    "HeartbeatExpired",
    "Holding",
    "JobState",
    "NodeCondition",
    "NodeState",
    "Observed",
    "PodGone",
    "PodPlacement",
    "Progress",
    "Record",
    "RecoveryAction",
    "RecoveryPlan",
    "Report",
    "RestoreSource",
    "Settle",
    "SidecarState",
    "Signal",
    "StepStalled",
    "TrainerSilent",
    "SystemCosts",
    "Tier",
    "StoredWindows",
    "UpstreamLog",
    "checkpoint_interval",
    "classify",
    "daly_interval",
    "decide",
    "ettr",
    "ettr_at_scale",
    "ettr_table",
    "expected_ettr",
    "lifeline_costs",
    "modeled_peers",
    "node_groups",
    "place_replicas",
    "plan_recovery",
    "stage_of",
    "window_rework_seconds",
    "young_interval",
]
