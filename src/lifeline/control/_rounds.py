"""The engine's inputs and outputs: what a runner observed (:class:`Observed`), what it remembers of
the job (:class:`Record`), its wish to settle (:class:`Settle`) and the engine's answer
(:class:`Decision`). Re-exported by :mod:`lifeline.control.engine` and :mod:`lifeline.control`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lifeline.api.recovery import Failure, RecoveryPlan
from lifeline.api.trainingjob import LayoutSpec, TrainingJobSpec
from lifeline.control.facts import CatalogFacts
from lifeline.control.failures import Signal
from lifeline.control.state import ClusterState

__all__ = ["SidecarState", "Observed", "Record", "Settle", "Decision"]


@dataclass(frozen=True)
class SidecarState:
    """A rank's sidecar that the runner sees running (its container running, or its process alive).

    Attributes:
        rank: the rank.
        node: the node it runs on.
        running_since: when it started, seconds since the epoch.
        last_seen: when this runner last saw it registered on ``node`` (``None``: not yet, or the
            runner does not remember, e.g. an operator that restarted).
    """

    rank: int
    node: str | None
    running_since: float
    last_seen: float | None = None


@dataclass(frozen=True)
class Observed:
    """What a runner observed this round.

    Attributes:
        node_of_rank: node of each rank of the current layout (``None``: not placed, or a rank whose
            old incarnation the current plan is replacing and which therefore says nothing new).
        cluster: the nodes (ready, schedulable, capacity).
        signals: the runner's own failure signals (container terminations not yet answered, pods
            gone, node conditions of the nodes the job uses).
        sidecars: the sidecars the runner sees running.
        ready: ranks whose pod (or processes) are ready.
        finished: every trainer exited 0.
        catalog: the catalog's facts (``None``: the catalog could not be read this round).
        restarts_trainers: the runner can restart a frozen trainer in its pod, keeping the sidecar
            (``lifeline run`` kills the process); the operator cannot yet (it replaces the pod).
        trainer_started: rank -> when its running trainer (process or container) started, seconds
            since the epoch, whoever started it (a plan, the runner restarting a straggler); a rank
            left out is not known (then a silent rank gets the start-up grace, never less).
    """

    node_of_rank: tuple[str | None, ...]
    cluster: ClusterState
    signals: tuple[Signal, ...] = ()
    sidecars: tuple[SidecarState, ...] = ()
    ready: frozenset[int] = frozenset()
    finished: bool = False
    catalog: CatalogFacts | None = None
    restarts_trainers: bool = False
    trainer_started: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    """What the runner remembers of the job (the operator: annotations and status; ``lifeline run``: memory).

    Attributes:
        phase, reason, message: the current phase and why.
        generation: the current generation.
        restarts: recoveries performed.
        plan: the plan that started ``generation`` (``None`` at generation 0).
        cool_downs: node -> expiry (seconds since the epoch) for the job's pods.
        acted_at: when the current plan was made (restarts the hang clock; ``None``: never).
        resumed_from: a run resumed from storage starts at this step, which counts as reached.
        state_step: the step the ranks' states were at when the runner last saw their progress
            (:attr:`Decision.state_step`, kept by the runner): the engine plans from it while the
            catalog holds no progress at all (its Redis came back empty, and no trainer that could
            report again is left: fuzz seed 2 of ``--model pipelining-moe``).
    """

    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    generation: int = 0
    restarts: int = 0
    plan: RecoveryPlan | None = None
    cool_downs: Mapping[str, float] = field(default_factory=dict)
    acted_at: float | None = None
    resumed_from: int = 0
    state_step: int = 0

    def layout(self, spec: TrainingJobSpec) -> LayoutSpec:
        """The layout of the current generation (the plan's, after a reshard)."""
        return self.plan.layout if self.plan is not None else spec.layout


@dataclass(frozen=True)
class Settle:
    """A runner's wish to plan on settled holdings: ``since`` the first failure signal (seconds since
    the epoch); ``quiet`` when every live trainer reported itself blocked and the holdings did not
    change between two rounds."""

    since: float
    quiet: bool


@dataclass(frozen=True)
class Decision:
    """The engine's answer for one round.

    Attributes:
        phase: Pending, Running, Recovering, Succeeded or Failed.
        reason: CamelCase reason (conditions, events).
        message: human-readable summary.
        generation, layout: of the job after this decision.
        failures: failures seen this round (empty when none).
        plan: a new recovery plan to record and apply (``None``: none; a ``GiveUp`` plan with Failed).
        resumed: training resumed after a recovery (close its record).
        settling: failures are seen but planning waits for the job to settle.
        state_step: the step the ranks' states are at as this round saw it (the runner keeps it in
            :attr:`Record.state_step`).
    """

    phase: str
    reason: str
    message: str
    generation: int
    layout: LayoutSpec
    failures: tuple[Failure, ...] = ()
    plan: RecoveryPlan | None = None
    resumed: bool = False
    settling: bool = False
    state_step: int = 0
