"""What the recovery planner knows: the cluster's nodes and the job's copies (frozen, pure).

The operator fills these from pods, nodes and the Redis catalog; the local launcher from its
processes. Times are seconds since the epoch (the caller's clock, passed in as ``now``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from lifeline.api.recovery import TIERS, Holding, Tier
from lifeline.api.trainingjob import LayoutSpec, RecoveryAction
from lifeline.errors import ConfigError

__all__ = ["Tier", "TIERS", "NodeState", "ClusterState", "Holding", "UpstreamLog", "StoredWindows", "JobState",
           "stage_of"]

def stage_of(rank: int, layout: LayoutSpec) -> int:
    """Pipeline stage of a global rank under the Megatron rank order of :mod:`lifeline.checkpoint`
    (tensor fastest, then expert, data, pipeline slowest): ``rank // (tensor * expert * data)``."""
    return rank // (layout.tensor * layout.expert * layout.data)


@dataclass(frozen=True)
class NodeState:
    """One node as the planner sees it.

    Attributes:
        name: the node name.
        ready: the node's Ready condition is True and it has no unreachable taint.
        schedulable: new pods may go there (False when cordoned).
        capacity: pods of this job the node can host; ``None`` when not limited.
    """

    name: str
    ready: bool = True
    schedulable: bool = True
    capacity: int | None = None


@dataclass(frozen=True)
class ClusterState:
    """The nodes and this job's node cool-downs (``(node, expiry seconds since epoch)`` pairs)."""

    nodes: tuple[NodeState, ...]
    cool_downs: tuple[tuple[str, float], ...] = ()

    def node(self, name: str) -> NodeState | None:
        """The :class:`NodeState` named ``name``, or ``None`` if the node is unknown (deleted)."""
        return next((n for n in self.nodes if n.name == name), None)

    def cooling(self, now: float) -> dict[str, float]:
        """Cool-downs still in force at ``now``: node -> expiry (seconds since epoch)."""
        return {node: until for node, until in self.cool_downs if until > now}


@dataclass(frozen=True)
class UpstreamLog:
    """What ``rank`` logged of the tensors it sent across pipeline boundaries (activations to the
    stage after, gradients to the stage before, and the steps' gradient norms) while computing
    steps ``first_step``..``last_step`` (inclusive): a neighbouring stage replays from them.

    Each entry lives in the rank's sidecar (the original) and, with ``replicas`` > 0, in a peer's
    (Gemini placement). ``originals_lost_to`` / ``replicas_lost_to``: the last step whose original /
    replica died with a sidecar in an earlier failure (-1: none), kept by the catalog."""

    rank: int
    first_step: int
    last_step: int
    replicas: int = 1
    originals_lost_to: int = -1
    replicas_lost_to: int = -1

    def covers(self, first: int, last: int) -> bool:
        """True when steps ``first``..``last`` (inclusive) are all logged (an empty range always is)."""
        return first > last or (self.first_step <= first and last <= self.last_step)

    @staticmethod
    def after_losing(logs: Iterable[UpstreamLog], lost: Iterable[int]) -> tuple[UpstreamLog, ...]:
        """The coverage left of ``logs`` once the sidecars of ``lost`` (ranks) died, by rank; a rank
        with nothing left is left out.

        A dead sidecar held its rank's originals and the replicas of other ranks' logs; which peer
        holds which replica is not recorded, so the death of any other sidecar counts as the death
        of every other rank's replica. A step whose original and replica have both died is gone,
        and the coverage starts after it. The catalog applies the same rule, atomically, when it
        stores the plan (:meth:`lifeline.catalog.Catalog.put_plan`, script ``PUT_PLAN``): a plan is
        made from what its own failures leave (fuzz seed 3089)."""
        out = {log.rank: log for log in logs}
        for dead in sorted(set(lost)):
            for rank, log in list(out.items()):
                last = log.last_step
                if rank == dead:
                    log = replace(log, originals_lost_to=max(log.originals_lost_to, last))
                    replicas_to = log.replicas_lost_to if log.replicas > 0 else last
                    originals_to = log.originals_lost_to
                else:
                    log = replace(log, replicas_lost_to=max(log.replicas_lost_to, last))
                    replicas_to, originals_to = log.replicas_lost_to, log.originals_lost_to
                first = max(log.first_step, min(originals_to, replicas_to) + 1)
                if first > last:
                    del out[rank]
                else:
                    out[rank] = replace(log, first_step=first)
        return tuple(out[r] for r in sorted(out))


@dataclass(frozen=True)
class StoredWindows:
    """The sparse windows (MoEvement §4) of ``rank`` committed to L2: each of ``starts`` begins a
    window of ``window`` steps whose slots and manifest are in storage."""

    rank: int
    starts: tuple[int, ...]
    window: int


@dataclass(frozen=True)
class JobState:
    """A job at the moment a failure is acted on.

    Attributes:
        layout: the current layout (after any earlier reshard).
        node_of_rank: node of each rank (index = global rank); length = world size.
        cluster: the nodes and cool-downs.
        step: latest step the trainers reached.
        generation: current process-group generation.
        restarts: recoveries performed so far.
        holdings: verified copies per (step, rank, tier), from the catalog.
        latest_complete_step: the catalog's latest complete step, if any (reported only).
        upstream_logs: upstream-log coverage per rank (empty when localized replay is off).
        stored_windows: sparse windows committed to L2 per rank (empty without sparse checkpoints).
        interrupted: the action of a recovery still under way when this failure came (a failure
            during a localized replay falls back to a global rung).
        unloaded: ranks the recovery still under way restores that have not reported loading its
            state yet (a replacement still starting, a survivor still restoring): a localized replay
            cannot keep their state, they have none yet.
        resharded_from: the restore step of the elastic reshard that made the current layout (the
            current generation's plan, when it is a ``Reshard``): until a step of the new layout is
            covered, the holdings of the new ranks cover nothing, and a failure restores this step
            again, resharded.
    """

    layout: LayoutSpec
    node_of_rank: tuple[str, ...]
    cluster: ClusterState
    step: int
    generation: int = 0
    restarts: int = 0
    holdings: frozenset[Holding] = field(default_factory=frozenset)
    latest_complete_step: int | None = None
    upstream_logs: tuple[UpstreamLog, ...] = ()
    stored_windows: tuple[StoredWindows, ...] = ()
    interrupted: RecoveryAction | None = None
    unloaded: frozenset[int] = frozenset()
    resharded_from: int | None = None

    def __post_init__(self) -> None:
        if len(self.node_of_rank) != self.layout.world_size:
            raise ConfigError(
                f"node_of_rank has {len(self.node_of_rank)} entries but the layout's world size is "
                f"{self.layout.world_size}",
                field="node_of_rank",
            )
        for h in self.holdings:
            if not 0 <= h.rank < self.world_size or (h.holder is not None and not 0 <= h.holder < self.world_size):
                raise ConfigError(f"holding {h} names a rank outside world size {self.world_size}", field="holdings")

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.node_of_rank)

    def ranks_on(self, nodes: Iterable[str]) -> tuple[int, ...]:
        """Ranks whose pods run on any of ``nodes``, ascending."""
        wanted = set(nodes)
        return tuple(r for r, n in enumerate(self.node_of_rank) if n in wanted)
