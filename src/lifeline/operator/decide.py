"""One reconcile's decision, from what was observed and recorded (pure; every rule from :mod:`lifeline.control`).

:func:`decide` turns an :class:`~lifeline.operator.observe.Observation` into control's
signals, asks :func:`lifeline.control.classify` what failed and
:func:`lifeline.control.plan.plan_recovery` what to do, and returns a :class:`Decision`:
the new phase, a plan to commit (if a new failure was seen), and the pods to delete and
create. The caller (:mod:`lifeline.operator.reconcile`) applies it; running ``decide`` twice
on the same observation gives the same decision, so a reconcile interrupted at any point is
simply repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lifeline.api.trainingjob import LayoutSpec, RecoveryAction, TrainingJobSpec
from lifeline.control.failures import CollectiveErrorReported, Failure, PodGone, Signal, StepStalled, classify
from lifeline.control.plan import RecoveryPlan, plan_recovery
from lifeline.control.state import ClusterState, JobState
from lifeline.operator.observe import (
    Observation,
    heartbeat_signals,
    node_signals,
    pod_generation,
    pod_signals,
    terminations,
)
from lifeline.operator.recorded import Recorded

__all__ = ["Decision", "decide", "HEARTBEAT_GRACE_SECONDS"]

HEARTBEAT_GRACE_SECONDS = 30.0
"""A Ready sidecar without a catalog registration for this long has lost its heartbeat."""


@dataclass(frozen=True)
class Decision:
    """What one reconcile does.

    Attributes:
        phase: the job's new phase (Pending, Running, Recovering, Succeeded, Failed).
        reason: CamelCase reason for the conditions (and the event, when one is due).
        message: human-readable summary for ``status.message``.
        generation: the generation the job is in after this decision.
        layout: the layout of that generation.
        failures: new failures seen (empty when none).
        plan: a new recovery plan to commit before acting (``None``: none).
        handled: with ``plan``: every pod's failed runs, recorded as answered.
        delete: ranks whose pods to delete, with grace 0 (replaced incarnations, pods stuck
            terminating on a lost node, ranks beyond a smaller world).
        create: ranks whose pods to create (if missing) at ``generation``.
        avoid_nodes: nodes the new pods must avoid (cool-downs in force).
        resumed: training resumed in ``generation`` after a recovery (closes the recovery record).
    """

    phase: str
    reason: str
    message: str
    generation: int
    layout: LayoutSpec
    failures: tuple[Failure, ...] = ()
    plan: RecoveryPlan | None = None
    handled: Mapping[str, Mapping[str, int]] | None = None
    delete: tuple[int, ...] = ()
    create: tuple[int, ...] = ()
    avoid_nodes: frozenset[str] = frozenset()
    resumed: bool = False


def _trainers_succeeded(pods: Mapping[int, Mapping[str, Any]], world: int) -> bool:
    """Every rank's trainer container terminated with exit code 0 (or the pod Succeeded)."""
    for rank in range(world):
        pod = pods.get(rank)
        if pod is None:
            return False
        status = pod.get("status") or {}
        if status.get("phase") == "Succeeded":
            continue
        cs = next((c for c in status.get("containerStatuses") or [] if c["name"] == "trainer"), None)
        term = ((cs or {}).get("state") or {}).get("terminated")
        if term is None or int(term.get("exitCode", 1)) != 0:
            return False
    return True


def _unready(pods: Mapping[int, Mapping[str, Any]], world: int) -> list[int]:
    """Ranks whose pod is missing or not Ready."""
    out = []
    for rank in range(world):
        conds = ((pods.get(rank) or {}).get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            out.append(rank)
    return out


def decide(
    spec: TrainingJobSpec,
    recorded: Recorded,
    obs: Observation,
    status: Mapping[str, Any],
    *,
    now: float,
) -> Decision:
    """Decide this reconcile's phase and actions (rules in the module docstring).

    Args:
        spec: the validated spec.
        recorded: the operator's record of the job (annotations).
        obs: what was observed now.
        status: the current ``.status`` (phase, restarts, step).
        now: seconds since the epoch (cool-downs and hang detection compare against it).

    Returns:
        The :class:`Decision`. Never raises for a job that can run; ``plan_recovery`` errors
        (none expected: it is only called with failures) propagate.
    """
    g = recorded.generation
    plan = recorded.plan
    layout = plan.layout if plan is not None else spec.layout
    world = layout.world_size
    old_phase = status.get("phase") or "Pending"
    cooling = {n: t for n, t in recorded.cool_downs.items() if t > now}
    avoid = frozenset(cooling)
    base = {"generation": g, "layout": layout, "avoid_nodes": avoid}

    if obs.progress.done_ranks >= set(range(world)) or _trainers_succeeded(obs.pods, world):
        # finishing while Recovering means training resumed (the timer missed the Running tick in between)
        return Decision("Succeeded", "TrainingComplete", f"all {world} ranks finished {spec.steps} steps",
                        resumed=old_phase == "Recovering", **base)

    # Pods the current plan replaces but whose old incarnation still exists: delete, then recreate.
    replaced = _recreated(plan, world) if plan is not None else set()
    stale = tuple(sorted(r for r, pod in obs.pods.items() if r in replaced and pod_generation(pod) < g))
    missing = tuple(r for r in range(world) if r not in obs.pods or r in stale)
    creating = recorded.applied < g
    live = {r: pod for r, pod in obs.pods.items() if r not in stale}

    # Ranks the current plan is still replacing say nothing new: neither their old incarnation
    # (live but older, or stuck terminating on a lost node) nor that node.
    skip = set(stale) | ({r for r in obs.terminating if r in replaced} if creating else set())
    signals: list[Signal] = pod_signals(live, world, missing_is_failure=not creating, handled=recorded.handled,
                                        ignore=skip)
    node_of_rank = tuple(None if r in skip else n for r, n in enumerate(obs.node_of_rank(world)))
    signals = [PodGone(s.rank, node_of_rank[s.rank], "pod deleted") if isinstance(s, PodGone) and s.node is None
               and s.rank in obs.terminating else s for s in signals]
    dying = [pod for r, pod in obs.terminating.items() if r not in skip]
    used = {(pod.get("spec") or {}).get("nodeName") for pod in [*live.values(), *dying]} - {None}
    signals += node_signals(obs.nodes.values(), used)
    if obs.catalog_error is None:
        if old_phase == "Running":
            signals += heartbeat_signals(live, obs.registered, now=now, grace_seconds=HEARTBEAT_GRACE_SECONDS)
            if obs.progress.last_time is not None:
                signals.append(StepStalled(obs.progress.step, max(0.0, now - obs.progress.last_time)))
        if obs.catalog_generation == g:
            node_of = obs.node_of_rank(world)
            signals += [CollectiveErrorReported(r, node_of[r] if r < world else None, d)
                        for r, d in obs.progress.failures if r < world]
    failures = classify(signals, node_of_rank=node_of_rank,
                        hang_timeout_seconds=spec.recovery.hang_timeout_seconds)

    if failures:
        state = JobState(
            layout=layout,
            node_of_rank=tuple(n or "" for n in node_of_rank),
            cluster=ClusterState(nodes=obs.cluster.nodes, cool_downs=tuple(sorted(cooling.items()))),
            step=obs.progress.step,
            generation=g,
            restarts=int(status.get("restarts", 0)),
            holdings=obs.holdings,
            latest_complete_step=obs.complete_step,
        )
        new = plan_recovery(state, failures, spec, now=now)
        if new.action is RecoveryAction.GIVE_UP:
            return Decision("Failed", "GiveUp", new.reason, failures=failures, plan=new, **base)
        handled = {(pod.get("metadata") or {}).get("uid", ""): terminations(pod) for pod in obs.pods.values()}
        recreate = _recreated(new, new.layout.world_size)
        condemned = set(obs.pods) | set(obs.terminating)  # terminating ones are force-deleted: the name is needed
        return Decision(
            "Recovering",
            new.action.value,
            new.reason,
            generation=new.generation,
            layout=new.layout,
            failures=failures,
            plan=new,
            handled=handled,
            delete=tuple(sorted((recreate & condemned) | set(new.delete_ranks))),
            create=tuple(sorted(recreate)),
            avoid_nodes=new.avoid_nodes | avoid,
        )

    create = missing if creating else ()
    dropped = set(plan.delete_ranks) if plan is not None and creating else set()
    delete = tuple(sorted(set(stale) | dropped | (set(create) & set(obs.terminating))))
    if old_phase == "Recovering":
        if obs.progress.trained_in(g, world):
            return Decision("Running", "Recovered", f"training resumed in generation {g} at step "
                            f"{obs.progress.step}", create=create, delete=delete, resumed=True, **base)
        return Decision("Recovering", status_reason(status, "Recovering"), status.get("message", ""),
                        create=create, delete=delete, **base)
    unready = _unready(live, world)
    if not missing and not unready:
        return Decision("Running", "AllRanksReady", f"{world} ranks running, step {obs.progress.step}",
                        create=create, delete=delete, **base)
    if old_phase == "Running":
        return Decision("Running", "AllRanksReady", f"{world} ranks running, step {obs.progress.step}",
                        create=create, delete=delete, **base)
    return Decision("Pending", "PodsStarting", f"waiting for the pods of ranks {unready} to be Ready",
                    create=create, delete=delete, **base)


def _recreated(plan: RecoveryPlan, world: int) -> set[int]:
    """Ranks whose pods ``plan`` (re)creates: its new placements, or every rank of the new layout
    for a reshard (each pod's env carries the layout, and a pod's env cannot change)."""
    if plan.action is RecoveryAction.RESHARD:
        return set(range(world))
    return {p.rank for p in plan.create_pods}


def status_reason(status: Mapping[str, Any], type_: str) -> str:
    """The current reason of condition ``type_`` in ``status`` (``type_`` itself if absent)."""
    return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == type_), None) or type_
