"""One reconcile's decision: the cluster's pods turned into control's signals, :func:`lifeline.control.decide`
asked what to do, and its answer turned into the pods to delete and create (pure).

:func:`decide_from_cluster` gathers what Kubernetes shows (pods, their containers, nodes, which sidecars run
where) into a :class:`lifeline.control.Observed`, leaves every rule to the one decision engine of
both runners, and adds what is Kubernetes' own: which pod incarnations the current plan still
replaces, which pods are missing, and the failed container runs the plan answers (recorded so a
trainer the kubelet restarted in place is not a new failure). Running it twice on the same
observation gives the same result, so a reconcile interrupted at any point is simply repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lifeline.api.recovery import Failure, RecoveryPlan
from lifeline.api.trainingjob import LayoutSpec, RecoveryAction, TrainingJobSpec, TrainingJobStatus
from lifeline.control import CatalogFacts, ClusterState, Decision, Observed, PodGone, Record, Signal
from lifeline.control import decide as engine_decide
from lifeline.operator.observe import (
    Observation,
    leaving,
    node_signals,
    pod_generation,
    pod_signals,
    sidecar_states,
    terminations,
    trainer_starts,
)
from lifeline.operator.recorded import Recorded

__all__ = ["Reconcile", "decide_from_cluster", "record_of", "recreated", "source_holders"]


@dataclass(frozen=True)
class Reconcile:
    """What one reconcile does: the engine's :class:`~lifeline.control.Decision` and the pod actions.

    Attributes:
        decision: the engine's answer (phase, reason, message, generation, layout, failures, plan).
        handled: with a new plan: every pod's failed container runs, recorded as answered.
        delete: ranks whose pods to delete, with grace 0 (replaced incarnations, pods stuck
            terminating on a lost node, ranks beyond a smaller world).
        create: ranks whose pods to create (if missing) at the decision's generation.
        avoid_nodes: nodes the new pods must avoid (cool-downs in force).
    """

    decision: Decision
    handled: Mapping[str, Mapping[str, int]] | None = None
    delete: tuple[int, ...] = ()
    create: tuple[int, ...] = ()
    avoid_nodes: frozenset[str] = frozenset()

    phase = property(lambda self: self.decision.phase, doc="The job's new phase.")
    reason = property(lambda self: self.decision.reason, doc="CamelCase reason.")
    message = property(lambda self: self.decision.message, doc="Human-readable summary.")
    generation = property(lambda self: self.decision.generation, doc="The generation after this reconcile.")
    layout = property(lambda self: self.decision.layout, doc="The layout of that generation.")
    resumed = property(lambda self: self.decision.resumed, doc="Training resumed after a recovery.")

    @property
    def failures(self) -> tuple[Failure, ...]:
        """New failures seen (empty when none)."""
        return self.decision.failures

    @property
    def plan(self) -> RecoveryPlan | None:
        """A new recovery plan to commit before acting (``None``: none)."""
        return self.decision.plan


def record_of(recorded: Recorded, status: TrainingJobStatus) -> Record:
    """The engine's :class:`~lifeline.control.Record` from the job's annotations and status
    (``status.step``, the latest step reached, is the state step the engine falls back on while the
    catalog holds no progress)."""
    current = next((c for c in status.conditions if c.type == "Recovering"), None)
    acted = next((r.started_at.timestamp() for r in reversed(status.recoveries)
                  if r.generation == recorded.generation), None)
    return Record(phase=status.phase, reason=current.reason if current is not None else "", message=status.message,
                  generation=recorded.generation, restarts=status.restarts, plan=recorded.plan,
                  cool_downs=recorded.cool_downs, acted_at=acted, state_step=status.step)


def _ready(pods: Mapping[int, Mapping[str, Any]]) -> frozenset[int]:
    return frozenset(rank for rank, pod in pods.items()
                     if any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (pod.get("status") or {}).get("conditions") or []))


def _finished(pods: Mapping[int, Mapping[str, Any]], world: int) -> bool:
    """Every rank's trainer container terminated with exit code 0 (or the pod Succeeded)."""
    for rank in range(world):
        status = (pods.get(rank) or {}).get("status")
        if status is None:
            return False
        if status.get("phase") == "Succeeded":
            continue
        cs = next((c for c in status.get("containerStatuses") or [] if c["name"] == "trainer"), None)
        term = ((cs or {}).get("state") or {}).get("terminated")
        if term is None or int(term.get("exitCode", 1)) != 0:
            return False
    return True


def decide_from_cluster(spec: TrainingJobSpec, recorded: Recorded, obs: Observation, status: TrainingJobStatus, *,
                        now: float, last_seen: Mapping[tuple[int, str], float] | None = None) -> Reconcile:
    """Decide this reconcile's phase and pod actions.

    Args:
        spec: the validated spec.
        recorded: the operator's record of the job (annotations).
        obs: what was observed now.
        status: the current status.
        now: seconds since the epoch.
        last_seen: ``(rank, pod UID) -> when a sidecar was last seen registered`` (soft memory).

    Returns:
        The :class:`Reconcile`. Never raises for a job that can run.
    """
    g = recorded.generation
    plan = recorded.plan
    layout: LayoutSpec = plan.layout if plan is not None else spec.layout
    world = layout.world_size
    avoid = frozenset(n for n, t in recorded.cool_downs.items() if t > now)

    # Pods the current plan replaces but whose old incarnation still exists: delete, then recreate.
    replaced = recreated(plan, world) if plan is not None else set()
    stale = tuple(sorted(r for r, pod in obs.pods.items() if r in replaced and pod_generation(pod) < g))
    missing = tuple(r for r in range(world) if r not in obs.pods or r in stale)
    creating = recorded.applied < g
    live = {r: pod for r, pod in obs.pods.items() if r not in stale}

    # Ranks the current plan is still replacing say nothing new: neither their old incarnation
    # (live but older, or stuck terminating on a lost node) nor that node.
    skip = set(stale) | ({r for r in obs.terminating if r in replaced} if creating else set())
    node_of_rank = tuple(None if r in skip else n for r, n in enumerate(obs.node_of_rank(world)))
    signals: list[Signal] = pod_signals(live, world, missing_is_failure=not creating, handled=recorded.handled,
                                        ignore=skip)
    signals = [PodGone(s.rank, node_of_rank[s.rank], "pod deleted") if isinstance(s, PodGone) and s.node is None
               and s.rank in obs.terminating else s for s in signals]
    staying = leaving(obs.terminating, now)  # a preempted or drained rank saving its step: not failed yet
    signals = [s for s in signals if not (isinstance(s, PodGone) and s.rank in staying)]
    dying = [pod for r, pod in obs.terminating.items() if r not in skip]
    used = {(pod.get("spec") or {}).get("nodeName") for pod in [*live.values(), *dying]} - {None}
    signals += node_signals(obs.nodes.values(), used)
    observed = Observed(
        node_of_rank=node_of_rank,
        cluster=ClusterState(nodes=obs.cluster.nodes),
        signals=tuple(signals),
        sidecars=sidecar_states(live, last_seen),
        ready=_ready(live) if not missing else frozenset(),
        finished=_finished(obs.pods, world),
        catalog=CatalogFacts.of(obs.catalog) if obs.catalog is not None else None,
        trainer_started=trainer_starts(live),
    )
    d = engine_decide(spec, record_of(recorded, status), observed, now=now)

    if d.plan is not None:
        if d.plan.action is RecoveryAction.GIVE_UP:
            return Reconcile(d, avoid_nodes=avoid)
        handled = {(pod.get("metadata") or {}).get("uid", ""): terminations(pod) for pod in obs.pods.values()}
        recreate = recreated(d.plan, d.layout.world_size)
        condemned = set(obs.pods) | set(obs.terminating)  # terminating ones are force-deleted: the name is needed
        early = set(d.plan.delete_ranks) - source_holders(d.plan)
        return Reconcile(d, handled=handled, delete=tuple(sorted((recreate & condemned) | early)),
                         create=tuple(sorted(recreate)), avoid_nodes=d.plan.avoid_nodes | avoid)
    if d.phase == "Succeeded":
        return Reconcile(d, avoid_nodes=avoid)
    create = missing if creating else ()
    # Pods an elastic reshard dropped: at once unless their sidecar is a source of the restore step
    # (it serves the new layout's reads), and every one once the new generation trains.
    beyond = {r for r in set(obs.pods) | set(obs.terminating) if r >= world}
    dropped = beyond if d.phase != "Recovering" else beyond - (source_holders(plan) if plan is not None else set())
    delete = tuple(sorted(set(stale) | dropped | (set(create) & set(obs.terminating))))
    return Reconcile(d, create=create, delete=delete, avoid_nodes=avoid)


def recreated(plan: RecoveryPlan, world: int) -> set[int]:
    """Ranks whose pods ``plan`` (re)creates: its new placements. An elastic reshard keeps the pods of
    ranks in both layouts (their trainers adopt the plan's layout in place, their sidecars keep
    serving what they hold) and creates only the new ranks' and the lost ones'."""
    return {p.rank for p in plan.create_pods if p.rank < world}


def source_holders(plan: RecoveryPlan) -> set[int]:
    """Ranks whose sidecars serve some shard of ``plan``'s restore step (kept until it trained)."""
    return {s.holder for s in plan.sources if s.holder is not None}
