"""The TrainingJob resource (``lifeline.dev/v1alpha1``): spec and status models.

These pydantic models are the one source of the CRD schema (see :mod:`lifeline.api.crd`).
Python names are snake_case, wire names camelCase; unknown fields are rejected. Cross-field
rules (replicas = product of the layout degrees, persist.every a multiple of every, a
container named ``trainer``, elastic minReplicas <= replicas) raise :func:`field_error` naming the
field and the fix, so pydantic reports them with every other problem and
:func:`lifeline.api.load_trainingjob` turns them all into one
:class:`~lifeline.errors.ConfigError`; the CRD carries the same rules as CEL so the API server
enforces them too. ``metadata.name`` must be a Kubernetes object name (:data:`NAME_RE`; the API
server checks it for custom resources, the models check it locally).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from lifeline.api._base import WireModel, field_error
from lifeline.api._recovery import ElasticSpec, RecoverySpec
from lifeline.api._stragglers import StragglerRecord
from lifeline.api._names import (NAME_MAX, NAME_RE, PERSIST_URI_PATTERN, SEED_MAX, check_name,
                                  check_persist_uri)
from lifeline.api._quantity import parse_bytes
from lifeline.api._template import TEMPLATE_SCHEMA, TRAINER_CONTAINER, template_problems

__all__ = [
    "StragglerRecord",
    "GROUP",
    "VERSION",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "TRAINER_CONTAINER",
    "PHASES",
    "CONDITION_TYPES",
    "RecoveryAction",
    "LayoutSpec",
    "MAX_WORLD_SIZE",
    "PersistSpec",
    "SparseSpec",
    "CheckpointSpec",
    "ElasticSpec",
    "RecoverySpec",
    "ModelSpec",
    "TrainingJobSpec",
    "Condition",
    "RecoveryRecord",
    "TrainingJobStatus",
    "TrainingJob",
    "NAME_RE",
    "NAME_MAX",
    "SEED_MAX",
    "PERSIST_URI_PATTERN",
    "check_name",
    "check_persist_uri",
]

GROUP = "lifeline.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
PHASES = ("Pending", "Running", "Recovering", "Succeeded", "Failed")
CONDITION_TYPES = ("Ready", "Progressing", "Recovering", "Degraded")

Phase = Literal["Pending", "Running", "Recovering", "Succeeded", "Failed"]
Tier = Literal["L0", "L1", "L2"]


class RecoveryAction(StrEnum):
    """The rungs of the recovery ladder (DESIGN.md "Failures"), cheapest first, plus giving up."""

    RESTART_IN_PLACE = "RestartInPlace"
    REPLACE_PODS = "ReplacePods"
    LOCALIZED_REPLAY = "LocalizedReplay"
    ROLLBACK = "Rollback"
    RESHARD = "Reshard"
    GIVE_UP = "GiveUp"


# A byte count given as an integer or a Kubernetes quantity ("8Gi"); always int bytes in Python.
Quantity = Annotated[
    int,
    BeforeValidator(parse_bytes),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]

PodTemplate = Annotated[dict[str, Any], WithJsonSchema(TEMPLATE_SCHEMA)]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


MAX_WORLD_SIZE = 131_072
"""The most ranks a job may have (2^17; the largest published training jobs use about 100,000
accelerators). A bound in the CRD schema, so a hostile or mistyped spec (replicas 9,437,184) is refused
by the API server instead of making the operator read millions of catalog keys."""


class LayoutSpec(WireModel):
    """The parallel layout: tensor, pipeline, data and expert degrees (each >= 1).

    The world size is ``tensor * pipeline * data * expert``; rank order is Megatron-style
    (tensor fastest, then expert, data, pipeline slowest), as in :mod:`lifeline.checkpoint`.
    """

    tensor: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="Tensor-parallel degree.")
    pipeline: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="Pipeline-parallel degree (number of stages).")
    data: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="Data-parallel degree (number of replica groups).")
    expert: int = Field(1, ge=1, le=MAX_WORLD_SIZE, description="Expert-parallel degree.")

    @property
    def world_size(self) -> int:
        """Number of ranks: ``tensor * pipeline * data * expert``."""
        return self.tensor * self.pipeline * self.data * self.expert


class PersistSpec(WireModel):
    """Persistence of complete checkpoints to object storage (tier L2)."""

    every: int = Field(
        50, ge=1, description="Steps between persisted (L2) checkpoints; a multiple of checkpoint.every."
    )
    uri: str = Field(
        json_schema_extra={"pattern": PERSIST_URI_PATTERN},
        description="Where checkpoints are persisted: s3://bucket/prefix, az://container/prefix, gs://bucket/prefix or "
                    "file:///path.",
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, uri: str) -> str:
        problem = check_persist_uri(uri)
        if problem:
            raise field_error("spec.checkpoint.persist.uri", problem)
        return uri


class SparseSpec(WireModel):
    """Sparse expert checkpointing (after MoEvement): each step captures a slot of the operators."""

    window: int = Field(
        1, ge=1,
        description="W: steps over which the sparse checkpoints capture every operator (expert, router, "
        "the rest) once with its optimizer state. Slots are kept in the sidecars' memory with the "
        "upstream log and serve recovery.localizedReplay (needed for them to be taken).",
    )


class CheckpointSpec(WireModel):
    """In-memory checkpointing by the sidecars (L0/L1) and persistence (L2)."""

    every: int = Field(1, ge=1, description="Steps between in-memory (L0/L1) checkpoints.")
    peer_replicas: int = Field(1, ge=0, description="L1 copies of each shard, held by sidecars on other nodes.")
    keep: int = Field(2, ge=1, description="Checkpoints each sidecar keeps in memory per rank.")
    memory_limit: Quantity | None = Field(
        None,
        description="Memory for the sidecar's checkpoints (bytes or a quantity such as 8Gi); "
        "unset: sized from the state.",
    )
    backpressure: Literal["wait", "skip"] = Field(
        "wait",
        description="When no arena slot is free: wait (measured, reported) or skip this checkpoint.",
    )
    persist: PersistSpec | None = Field(
        None, description="Persistence to object storage (L2); unset: memory tiers only."
    )
    sparse: SparseSpec | None = Field(
        None, description="Sparse expert checkpointing; unset: every checkpoint is dense."
    )

    @model_validator(mode="after")
    def _persist_multiple(self) -> CheckpointSpec:
        if self.persist is not None and self.persist.every % self.every != 0:
            lower = self.persist.every - self.persist.every % self.every
            hint = f"{lower} or {lower + self.every}" if lower else f"{self.every}"
            raise field_error(
                "spec.checkpoint.persist.every",
                f"spec.checkpoint.persist.every ({self.persist.every}) must be a multiple of "
                f"spec.checkpoint.every ({self.every}): only in-memory checkpoints are persisted; "
                f"use e.g. {hint}",
            )
        return self


class ModelSpec(WireModel):
    """Settings handed to the trainer's model (free-form)."""

    name: str | None = Field(None, description="Model name, e.g. gpt-moe.")
    args: FreeForm = Field(default_factory=dict, description="Free-form model arguments.")


class TrainingJobSpec(WireModel):
    """The desired training run."""

    replicas: int = Field(ge=1, le=MAX_WORLD_SIZE,
                          description="World size: one pod per rank; equals the product of the layout degrees "
                                      "(at most 131072).")
    layout: LayoutSpec = Field(description="The parallel layout.")
    template: PodTemplate = Field(
        description="A PodTemplateSpec for every rank; the training container must be named 'trainer'.",
    )
    steps: int = Field(ge=1, description="Optimizer steps to train; the job Succeeds after the last one.")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="Seed of every random number generator (deterministic runs); at most 2^32-1.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,  # type: ignore[arg-type]
        json_schema_extra={"default": {}},
        description="Checkpointing.",
    )
    recovery: RecoverySpec = Field(
        default_factory=RecoverySpec,  # type: ignore[arg-type]
        json_schema_extra={"default": {}},
        description="Failure recovery.",
    )
    model: ModelSpec | None = Field(None, description="Model settings handed to the trainer.")

    @field_validator("template")
    @classmethod
    def _trainer_container(cls, template: dict[str, Any]) -> dict[str, Any]:
        pod_spec = template.get("spec")
        containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
        names = [c.get("name") for c in containers or [] if isinstance(c, dict)]
        if TRAINER_CONTAINER not in names:
            raise field_error(
                "spec.template.spec.containers",
                f"spec.template.spec.containers has no container named '{TRAINER_CONTAINER}' "
                f"(found {names or 'none'}); name the training container '{TRAINER_CONTAINER}'",
            )
        problems = template_problems(template)  # the fields the CRD types (env, volumes, ...)
        if problems:
            field, problem = problems[0]
            raise field_error(field, f"{problem}; write spec.template as a Kubernetes PodTemplateSpec "
                              "(env: a list of {name, value})")
        return template

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        lay = self.layout
        if self.replicas != lay.world_size:
            raise field_error(
                "spec.replicas",
                f"spec.replicas ({self.replicas}) must equal the product of spec.layout degrees "
                f"tensor*pipeline*data*expert = {lay.tensor}*{lay.pipeline}*{lay.data}*{lay.expert} = "
                f"{lay.world_size}; set replicas to {lay.world_size} or change the layout",
            )
        elastic = self.recovery.elastic
        if elastic is not None and elastic.min_replicas > self.replicas:
            raise field_error(
                "spec.recovery.elastic.minReplicas",
                f"spec.recovery.elastic.minReplicas ({elastic.min_replicas}) must be <= spec.replicas "
                f"({self.replicas})",
            )
        return self

    def trainer_container(self) -> dict[str, Any]:
        """The ``trainer`` container of :attr:`template` (a dict in the Kubernetes shape)."""
        return next(c for c in self.template["spec"]["containers"] if c.get("name") == TRAINER_CONTAINER)


class Condition(WireModel):
    """A status condition in the ``metav1.Condition`` shape."""

    type: str = Field(description="Ready, Progressing, Recovering or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation this condition reflects.")
    last_transition_time: datetime = Field(description="When status last changed (RFC 3339).")
    reason: str = Field(description="CamelCase reason code.")
    message: str = Field("", description="Human-readable detail.")


class RecoveryRecord(WireModel):
    """One recovery the operator performed (newest last in ``status.recoveries``)."""

    generation: int = Field(ge=0, description="The generation the recovery started.")
    kind: RecoveryAction = Field(description="The recovery ladder rung taken.")
    ranks: list[int] = Field(default_factory=list, description="Ranks that failed.")
    from_step: int | None = Field(None, ge=0, description="Step restored from.")
    tier: Tier | None = Field(None, description="Farthest tier read (L0, L1 or L2).")
    started_at: datetime = Field(description="When the failure was acted on.")
    resumed_at: datetime | None = Field(None, description="When training resumed.")
    seconds: float | None = Field(None, ge=0, description="Seconds from startedAt to resumedAt.")
    reason: str = Field("", description="Why: the failures seen and the rule that chose this rung.")
    layout: LayoutSpec | None = Field(
        None, description="Reshard only: the layout the job continued in (smaller or back to the spec's)."
    )


class TrainingJobStatus(WireModel):
    """The observed state of a TrainingJob, written by the operator."""

    phase: Phase = Field("Pending", description="Pending, Running, Recovering, Succeeded or Failed.")
    step: int = Field(0, ge=0, description="Latest step reached by the trainers.")
    complete_step: int | None = Field(None, ge=0, description="Latest complete checkpoint step.")
    generation: int = Field(0, ge=0, description="Incarnation of the process group; +1 at every recovery.")
    restarts: int = Field(0, ge=0, description="Recoveries performed.")
    replicas: int | None = Field(
        None, ge=1, description="Current world size (differs from spec after an elastic reshard)."
    )
    layout: LayoutSpec | None = Field(None, description="Current layout (differs from spec after an elastic reshard).")
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Recovering, Degraded (one per type).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    recoveries: list[RecoveryRecord] = Field(default_factory=list, description="Recoveries performed, oldest first.")
    stragglers: list[StragglerRecord] = Field(
        default_factory=list, description="Ranks flagged as stragglers in the current generation, by rank.")
    message: str = Field("", description="Human-readable summary of the state.")


class TrainingJob(WireModel):
    """A whole TrainingJob object (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``)."""

    api_version: Literal["lifeline.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["TrainingJob"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None

    @field_validator("metadata")
    @classmethod
    def _name(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        if "name" in metadata:
            problem = check_name(metadata["name"])
            if problem:
                raise field_error("metadata.name", problem)
        return metadata

    @property
    def name(self) -> str | None:
        """``metadata.name``."""
        return self.metadata.get("name")

    @property
    def namespace(self) -> str | None:
        """``metadata.namespace``."""
        return self.metadata.get("namespace")
