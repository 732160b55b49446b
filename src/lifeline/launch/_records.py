"""The supervisor's records: its options, one record per recovery, and the display's snapshot."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lifeline.api import LayoutSpec
from lifeline.catalog import CatalogView, ProgressReport
from lifeline.errors import ConfigError
from lifeline.launch._observe import tier_steps
from lifeline.launch.inject import Injection

__all__ = ["LaunchOptions", "RecoveryRecord", "Snapshot", "Tally", "stuck_ranks"]


@dataclass(frozen=True)
class LaunchOptions:
    """How to run (``lifeline run`` options).

    Attributes:
        state_dir: logs, arenas' parent, Redis and MinIO data, the default file L2 store.
        injections: failures to inject.
        persist_uri: L2 URI replacing the spec's (``None``: the spec's, see :mod:`.services`).
        s3_endpoint: an external S3 endpoint for ``s3://`` URIs (``""``: start MinIO).
        spare_nodes: "nodes" beyond one per rank that replacements can move to (default: as
            many as ranks).
        slot_bytes: arena slot size per rank unless the template sets ``LIFELINE_SLOT_BYTES``.
        poll_seconds: the supervision round (a process exit ends a round at once).
        timeout_seconds: give up the whole run after this long (``None``: never).
        extra_env: variables for every process (e.g. shorter timeouts in tests).
        spares_per_node: pre-warmed trainer processes kept on every node that runs a rank (an
            in-place restart takes one instead of starting Python and torch), and pre-warmed
            sidecar + trainer pairs on each standby node (see :mod:`lifeline.launch.spare_pool`);
            0 turns spares off.
        standby_nodes: free nodes that keep spares for replacements: the first ones by name,
            which are the nodes ``lifeline.control`` places replacements on.
        warm_start: start every spare first and start the ranks only when all are ready (for
            benchmarks and tests whose first failure must meet a warm pool); otherwise spares warm
            one at a time in the background once training runs.
        node_return_seconds: a lost node is Ready again this many seconds after it was lost (a
            repaired node rejoining; an elastic job then grows back); ``None``: lost for good.
        templates: start every rank process and spare by forking a template process per role
            that imported torch and the runtime once (:mod:`lifeline.launch.templates`: a start
            then costs milliseconds, not 3–5 CPU-seconds); ``False``: every process is a fresh
            interpreter, as in a container.
        unhealthy_nodes: ``{node: KIND or KIND:rejoin}`` (``KIND`` compute, slow or network): the
            health-check fault each of these nodes gets in its first check, or in the check when it
            comes back (``--unhealthy-node``; needs ``spec.recovery.healthCheck.enabled``).
    """

    state_dir: Path
    injections: tuple[Injection, ...] = ()
    persist_uri: str | None = None
    s3_endpoint: str = ""
    spare_nodes: int | None = None
    slot_bytes: int = 64 << 20
    poll_seconds: float = 0.05
    timeout_seconds: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    spares_per_node: int = 1
    standby_nodes: int = 1
    warm_start: bool = False
    node_return_seconds: float | None = None
    templates: bool = True
    unhealthy_nodes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("spares_per_node", "standby_nodes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0 (0 turns it off), got "
                                  f"{getattr(self, name)}", field=name)


@dataclass
class RecoveryRecord:
    """One recovery: when it was acted on and resumed (seconds since epoch), what it did.

    Timeline (seconds since epoch): ``failed_at`` (the fault: the injection, for an injected failure —
    ``fault`` is ``"injected"`` — else the newest step report before the failure was seen — ``fault`` is
    ``"last_step"``: the last moment the job is known to have worked), ``noticed_at``
    (the supervisor saw the first failure signal), ``started_at`` (the round that planned began),
    ``planned_at`` (``lifeline.control`` returned the plan), ``published_at`` (the plan is in the
    catalog), ``launched_at`` (every restarted or replacement process started), ``resumed_at``
    (every rank trained in the new generation), ``caught_up_at`` (every rank past ``from_step``).
    ``spares`` counts the trainers started from pre-warmed spares; ``stuck`` lists survivors
    restarted because they stayed stuck in the old generation (:data:`STUCK_SECONDS`).
    """

    generation: int
    action: str
    failures: list[str]
    ranks: list[int]
    from_step: int
    restore_step: int | None
    tier: str | None
    started_at: float
    failed_at: float | None = None
    fault: str = "injected"
    noticed_at: float | None = None
    planned_at: float | None = None
    published_at: float | None = None
    launched_at: float | None = None
    resumed_at: float | None = None
    caught_up_at: float | None = None
    spares: int = 0
    stuck: list[int] = field(default_factory=list)
    layout: dict[str, int] | None = None

    @property
    def fault_at(self) -> float:
        """When the failure happened (``failed_at``; when it was acted on if unknown)."""
        return self.failed_at if self.failed_at is not None else self.started_at

    @property
    def seconds(self) -> float | None:
        """The fault → every rank trained in the new generation: detection included."""
        return None if self.resumed_at is None else self.resumed_at - self.fault_at

    @property
    def acted_seconds(self) -> float | None:
        """Failure acted on → every rank trained in the new generation (the recovery alone)."""
        return None if self.resumed_at is None else self.resumed_at - self.started_at

    @property
    def to_same_step_seconds(self) -> float | None:
        """The fault (:attr:`fault_at`) → every rank trained past the step the job had reached: the
        time lost, detection and rework included."""
        if self.caught_up_at is None:
            return None
        return self.caught_up_at - self.fault_at

    @property
    def steps_lost(self) -> int | None:
        """Steps of work redone: the step reached minus the step restored."""
        return None if self.restore_step is None else max(0, self.from_step - self.restore_step)

    def to_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "action": self.action, "failures": self.failures,
                "ranks": self.ranks, "from_step": self.from_step, "restore_step": self.restore_step,
                "steps_lost": self.steps_lost, "tier": self.tier, "layout": self.layout,
                "seconds": None if self.seconds is None else round(self.seconds, 3),
                "acted_seconds": None if self.acted_seconds is None else round(self.acted_seconds, 3),
                "fault": self.fault,
                "detect_seconds": round(self.started_at - self.fault_at, 3),
                "to_same_step_seconds": None if self.to_same_step_seconds is None
                else round(self.to_same_step_seconds, 3), "spares": self.spares, "stuck": self.stuck,
                "timeline": {k: round(v, 4) for k, v in (
                    ("failed_at", self.failed_at), ("noticed_at", self.noticed_at), ("round_at", self.started_at),
                    ("planned_at", self.planned_at), ("published_at", self.published_at),
                    ("launched_at", self.launched_at), ("resumed_at", self.resumed_at),
                    ("caught_up_at", self.caught_up_at)) if v is not None}}


@dataclass
class Snapshot:
    """What the progress display shows (updated every round)."""

    job: str
    steps: int
    layout: LayoutSpec
    phase: str = "Pending"
    generation: int = 0
    step: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    tiers: dict[str, int | None] = field(default_factory=dict)
    complete_step: int | None = None
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)


@dataclass
class Tally:
    """What the trainers' reports add up to over a run: each step's time and each save's stall
    (keyed ``(generation, rank, step)``, first report wins), the highest step each rank reached and
    when the newest step report was written (``last_step_at``, seconds since the epoch).

    It also watches the catalog's latest complete step, which must never move backwards:
    ``complete_samples`` rounds read it, ``complete_unavailable`` of them found none (a fresh or
    restarted catalog), and ``complete_regressions`` lists ``(time, highest seen, value read)`` for
    every read below the highest seen before.
    """

    step_seconds: dict[tuple[int, int, int], float] = field(default_factory=dict)
    stall_seconds: dict[tuple[int, int, int], float] = field(default_factory=dict)
    seen_step: dict[int, int] = field(default_factory=dict)
    last_step_at: float | None = None
    complete_samples: int = 0
    complete_unavailable: int = 0
    complete_highest: int | None = None
    complete_regressions: list[tuple[float, int, int]] = field(default_factory=list)

    def observe(self, view: CatalogView, snap: Snapshot, layout: LayoutSpec) -> None:
        """Take this round's reports into the tally and the display's snapshot."""
        snap.generation = view.generation
        snap.tiers = tier_steps(view.holdings, layout.world_size)
        snap.step = max((r.step or 0 for r in view.reports.values()), default=0)
        self._complete(view.complete_step)
        snap.complete_step = view.complete_step
        for rank, rec in view.reports.items():
            key = (rec.generation, rank, rec.step or 0)
            if rec.event == "step":
                self.last_step_at = max(self.last_step_at or 0.0, rec.time)
                if rec.get("seconds") is not None:
                    self.step_seconds.setdefault(key, float(rec.get("seconds")))
                if rec.get("loss") is not None:
                    snap.loss = float(rec.get("loss"))
                if rec.get("tokens_per_s") is not None and rank == 0:
                    snap.tokens_per_s = float(rec.get("tokens_per_s")) * layout.data
            elif rec.event == "save" and rec.get("seconds") is not None:
                self.stall_seconds.setdefault(key, float(rec.get("seconds")))
            if rec.event in ("step", "save", "done"):
                self.seen_step[rank] = max(self.seen_step.get(rank, 0), rec.step or 0)

    def _complete(self, step: int | None) -> None:
        self.complete_samples += 1
        if step is None:
            self.complete_unavailable += 1
            return
        if self.complete_highest is not None and step < self.complete_highest:
            self.complete_regressions.append((time.time(), self.complete_highest, step))
        self.complete_highest = step if self.complete_highest is None else max(self.complete_highest, step)

    def complete_summary(self) -> dict[str, Any]:
        """``{"samples", "unavailable", "highest", "regressions": [{"at", "from", "to"}]}``."""
        return {"samples": self.complete_samples, "unavailable": self.complete_unavailable,
                "highest": self.complete_highest,
                "regressions": [{"at": round(t, 4), "from": a, "to": b} for t, a, b in self.complete_regressions]}


class _PodLike(Protocol):
    @property
    def trainer_started_at(self) -> float | None: ...

    def exit_code(self, role: str) -> int | None: ...


def stuck_ranks(rec: RecoveryRecord, pods: Mapping[int, _PodLike], reports: Mapping[int, ProgressReport]) -> list[int]:
    """Surviving ranks whose trainer (alive, started before the recovery) has neither read the plan
    of ``rec`` (the runtime's ``plan`` report) nor joined its generation.

    A trainer process that has not reported yet is starting, not stuck, even when it was started for
    an earlier plan: it joins the generation the catalog names when it gets there (fuzz seed 3386: a
    trainer restarted for generation 1 was still importing when generation 2 was published, was
    killed as stuck just after it began hosting generation 2's rendezvous store, and the survivors
    connected to that store failed: a third recovery without a fault)."""
    out = []
    for rank, pod in sorted(pods.items()):
        started = pod.trainer_started_at or 0.0
        if pod.exit_code("trainer") is not None or started >= rec.started_at:
            continue  # dead (answered by the engine) or started for this plan
        report = reports.get(rank)
        if report is None or report.time < started:
            continue  # this process has not reported yet: starting
        if report.generation >= rec.generation or int(report.get("plan_generation", -1)) >= rec.generation:
            continue  # it read the plan or already joined
        out.append(rank)
    return out
