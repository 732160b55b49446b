"""lifeline.api: the TrainingJob resource as pydantic models, the one source of the CRD schema.

- :mod:`lifeline.api.trainingjob` - spec and status models (camelCase on the wire).
- :mod:`lifeline.api.load` - :func:`load_trainingjob` from YAML or a dict, errors naming the field.
- :mod:`lifeline.api.crd` - :func:`build_crd`; ``python -m lifeline.api.crd --write``.
- :mod:`lifeline.api.pod` - pod-level settings (``LIFELINE_*`` environment).
- :mod:`lifeline.api.manifests` - the pod of a rank and the job's Secret (pure builders).
- :mod:`lifeline.api.recovery` - the recovery plan document and its values (failures, holdings).
"""

from lifeline.api.load import field_path, load_trainingjob
from lifeline.api.recovery import (
    TIERS,
    Failure,
    FailureKind,
    Holding,
    PodPlacement,
    RecoveryPlan,
    RestoreSource,
    Tier,
)
from lifeline.api._numerics import LossSpikeSpec
from lifeline.api._health import HealthCheckSpec
from lifeline.api._stragglers import StragglerSpec
from lifeline.api.trainingjob import (
    API_VERSION,
    CONDITION_TYPES,
    GROUP,
    KIND,
    PHASES,
    PLURAL,
    TRAINER_CONTAINER,
    VERSION,
    CheckpointSpec,
    Condition,
    ElasticSpec,
    LayoutSpec,
    ModelSpec,
    PersistSpec,
    RecoveryAction,
    RecoveryRecord,
    RecoverySpec,
    SparseSpec,
    TrainingJob,
    TrainingJobSpec,
    TrainingJobStatus,
)

__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "GROUP",
    "KIND",
    "PHASES",
    "PLURAL",
    "TRAINER_CONTAINER",
    "VERSION",
    "TIERS",
    "CheckpointSpec",
    "Condition",
    "ElasticSpec",
    "Failure",
    "FailureKind",
    "Holding",
    "LayoutSpec",
    "LossSpikeSpec",
    "StragglerSpec",
    "HealthCheckSpec",
    "ModelSpec",
    "PersistSpec",
    "PodPlacement",
    "RecoveryAction",
    "RecoveryPlan",
    "RecoveryRecord",
    "RecoverySpec",
    "RestoreSource",
    "SparseSpec",
    "Tier",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "build_crd",
    "field_path",
    "load_trainingjob",
]


def build_crd() -> dict:
    """The TrainingJob CRD as a dict; see :func:`lifeline.api.crd.build_crd`. (Imported on call:
    ``python -m lifeline.api.crd`` must not find its own module imported by the package first.)"""
    from lifeline.api.crd import build_crd as _build

    return _build()
