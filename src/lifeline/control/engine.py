"""The decision engine of both runners: what a runner observed in, the job's next phase and plan out.

The operator (``lifeline.operator``) and ``lifeline run`` (``lifeline.launch``) each gather what
they see into an :class:`Observed` (their own signals: container terminations, pods gone, node
conditions, which sidecars run where; and the catalog's :class:`CatalogFacts`) and remember a
:class:`Record` of the job; :func:`decide` applies one set of rules, with the timeouts and grace
periods of ``spec.recovery``, and returns a :class:`Decision`. The runners then apply its plan.

Rules, in order:

1. **Succeeded** when every trainer finished (exit 0, or a ``done`` report from every rank).
2. **Failures** from the runner's signals plus what the catalog shows:

   * a sidecar the runner sees running but whose registration is gone has lost its heartbeat:
     at once when the runner saw it registered more than one heartbeat period ago, else once
     ``startupGraceSeconds`` passed since it started (an empty registry means Redis lost its
     data, not that every sidecar died, and judges nobody);
   * a collective error reported alone (in the current generation) counts only after
     ``collectiveGraceSeconds``: a dead peer's own signal (its exit, its silent sidecar) must
     have had time to show, so that a node loss is one recovery, not a restart in place first;
   * no step progress for ``hangTimeoutSeconds`` (measured from the newest report, the last
     recovery or, while recovering, the newest recovery beat, whichever is later) is a hang; while
     recovering, trainers beat every second (``lifeline.runtime._beat``): while another beats, a rank
     whose current incarnation spoke and then stayed silent for ``hangTimeoutSeconds`` is frozen
     (:func:`_frozen_in_recovery`); ranks that have said nothing since the plan (trainers still
     starting) get ``startupGraceSeconds`` from the plan first, as a starting sidecar does (a
     liveness probe's initial delay); past it, a rank whose pod is Ready but which still said nothing
     is frozen (``TrainerSilent``: restarted in its pod while its sidecar heartbeats and the runner
     can, else its pod is replaced).

   :func:`~lifeline.control.failures.classify` folds them; :func:`~lifeline.control.plan.plan_recovery`
   picks the rung (never without the catalog's holdings: while it cannot be read, the decision waits). With ``settle`` given, planning waits until the job is quiet (the copies in
   flight are filed) or :data:`SETTLE_SECONDS` passed since the first signal.
3. **Recovering** becomes **Running** once every rank trained in the new generation.
4. **Grow**: a job running below the spec's size after an elastic shrink, whose every rank trained
   in the current generation, reshards back up when healthy nodes outside cool-down have room
   (:func:`~lifeline.control.elastic.plan_grow`): a ``Reshard`` plan with no failure.
5. Otherwise **Running** when every rank is ready (or the job was running), else **Pending**.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from lifeline.api.trainingjob import LayoutSpec, RecoveryAction, TrainingJobSpec
from lifeline.control.failures import (
    CollectiveErrorReported,
    HeartbeatExpired,
    Signal,
    StepStalled,
    TrainerSilent,
    classify,
)
from lifeline.control._rounds import Decision, Observed, Record, Settle, SidecarState
from lifeline.control.elastic import plan_grow
from lifeline.control.facts import CatalogFacts
from lifeline.control.plan import plan_recovery
from lifeline.control.preemption import annotate, preempted
from lifeline.control.progress import Progress
from lifeline.control.state import ClusterState, JobState

__all__ = ["SETTLE_SECONDS", "SidecarState", "CatalogFacts", "Observed", "Record", "Settle", "Decision", "decide"]

SETTLE_SECONDS = 1.0
"""Planning waits at most this long after the first failure signal when the runner asks to settle
(:class:`Settle`): the dead rank's last save may still be sealing, and survivors finish the step
they are in before they block. A plan made on the settled holdings names a step every rank holds."""


def _silent_sidecars(spec: TrainingJobSpec, sidecars: Iterable[SidecarState], registered: Mapping[int, str],
                     now: float) -> list[Signal]:
    """:class:`HeartbeatExpired` for running sidecars without a live registration on their node."""
    if not registered:
        return []
    rec = spec.recovery
    out: list[Signal] = []
    for sc in sidecars:
        node = registered.get(sc.rank)
        if node is not None and (sc.node is None or node in (sc.node, "")):
            continue
        if sc.last_seen is not None:
            if now - sc.last_seen > rec.heartbeat_seconds:
                out.append(HeartbeatExpired(sc.rank, sc.node, now - sc.last_seen))
        elif now - sc.running_since > rec.startup_grace_seconds:
            out.append(HeartbeatExpired(sc.rank, sc.node, now - sc.running_since))
    return out


def _catalog_emptied(spec: TrainingJobSpec, observed: Observed, facts: CatalogFacts, now: float) -> bool:
    """True when no sidecar is registered although the runner sees sidecars running, one of them seen
    registered (or started) within ``startupGraceSeconds``: the catalog's Redis restarted empty, and
    the sidecars register their copies again at their next heartbeat (a plan made now would find
    none and start over)."""
    if facts.registered or not observed.sidecars:
        return False
    latest = max(sc.last_seen or sc.running_since for sc in observed.sidecars)
    return now - latest < spec.recovery.startup_grace_seconds


def _catalog_signals(spec: TrainingJobSpec, record: Record, observed: Observed, world: int,
                     now: float) -> list[Signal]:
    facts = observed.catalog
    if facts is None:
        return []
    signals = _silent_sidecars(spec, observed.sidecars, facts.registered, now)
    progress = facts.progress
    if record.phase in ("Running", "Recovering") and progress.last_time is not None:
        since = max(progress.last_time, record.acted_at or 0.0)
        rec = spec.recovery
        recovering = record.phase == "Recovering" and record.acted_at is not None
        started = observed.trainer_started
        # still starting: nothing said since the plan, or nothing by the current incarnation (a trainer
        # restarted after its old incarnation's last word: fuzz pipelining-moe seed 23)
        silent = progress.silent_since(record.acted_at, world) | _unspoken(progress, world, started) \
            if recovering else frozenset()
        frozen = _frozen_in_recovery(spec, record, progress, world, now, started) if recovering else {}
        if recovering and progress.last_beat is not None:  # trainers that beat are recovering, not stalled
            since = max(since, progress.last_beat)
        starting = silent - frozen.keys()
        if starting:  # restarted trainers are still starting: the start-up grace first
            since = max(since, record.acted_at + max(0.0, rec.startup_grace_seconds - rec.hang_timeout_seconds))
            for r in starting:  # past it, a running one is frozen (the grace counts from its start)
                began = max(record.acted_at, started.get(r, record.acted_at))
                if now - began > rec.startup_grace_seconds:
                    frozen[r] = now - began
        signals += [TrainerSilent(r, observed.node_of_rank[r], seconds,
                                  in_place=observed.restarts_trainers and r in facts.registered)
                    for r, seconds in sorted(frozen.items()) if r in observed.ready]
        signals.append(StepStalled(progress.step, max(0.0, now - since)))
    if facts.generation == record.generation:
        grace = spec.recovery.collective_grace_seconds
        signals += [CollectiveErrorReported(rank, observed.node_of_rank[rank], detail)
                    for rank, detail, at in progress.failures if rank < world and now - at >= grace]
    return signals


def _unspoken(progress: Progress, world: int, started: Mapping[int, float]) -> frozenset[int]:
    """Ranks whose running trainer started after their last word (its incarnation has said nothing)."""
    return frozenset(r for r in range(world) if (began := started.get(r)) is not None
                     and ((alive := progress.alive_at(r)) is None or alive < began))


def _frozen_in_recovery(spec: TrainingJobSpec, record: Record, progress: Progress, world: int, now: float,
                        started: Mapping[int, float]) -> dict[int, float]:
    """Ranks frozen during the current recovery -> seconds since each last said anything.

    A trainer beats every second while it starts or recovers (``lifeline.runtime._beat``), so while
    another rank still beats, a rank whose *current incarnation* has spoken (a report or a beat after
    its trainer started, :attr:`Observed.trainer_started`) and then went silent for
    ``hangTimeoutSeconds`` since its last word or the plan, whichever is later, is frozen: a survivor
    that froze as the plan came, or a restarted trainer that froze after it beat. A rank whose current
    incarnation has not spoken yet is still starting, whoever started it (this plan, an earlier one,
    the runner restarting a straggler): the start-up grace covers it, as does a rank whose trainer's
    start the runner does not report. With no rank beating, this is no rank's fault: the step stall
    decides (a hang of the whole job). Fuzz seed 606 (docs/control.md "Hangs during a recovery")."""
    rec = spec.recovery
    if progress.last_beat is None or now - progress.last_beat > rec.hang_timeout_seconds:
        return {}
    out = {}
    for rank in range(world):
        alive, began = progress.alive_at(rank), started.get(rank)
        if began is None or alive is None or alive < began or rank in progress.done_ranks:
            continue  # not known, or its current incarnation is still starting (the start-up grace)
        # a survivor blocked in a collective with a lost rank said nothing since its last step, maybe
        # longer ago than the timeout when the plan came: it gets the timeout from the plan on
        silent_for = now - max(alive, record.acted_at)
        if silent_for > rec.hang_timeout_seconds:
            out[rank] = silent_for
    return out


def _state_step(record: Record, facts: CatalogFacts) -> int:
    """The step the ranks' states are at (:meth:`Progress.state_step` with the current plan's restores)."""
    plan = record.plan
    if plan is None or plan.generation != record.generation:
        return facts.progress.step
    restored = {rank: plan.restore_step or 0 for rank in plan.restore_ranks}
    return facts.progress.state_step(record.generation, restored)


def _known_step(record: Record, facts: CatalogFacts) -> int:
    """The step the ranks' states are at: from their progress, or, while the catalog holds none at
    all (a Redis that came back empty), the step the runner last saw (:attr:`Record.state_step`).
    Copies newer than it are never restored, so reading 0 there would throw away every copy the
    repaired catalog lists and roll back to the initial state (fuzz seed 2, pipelining-moe)."""
    if not facts.progress.latest:
        return max(record.state_step, record.resumed_from)
    return max(_state_step(record, facts), record.resumed_from)


def _unloaded(record: Record, facts: CatalogFacts, world: int) -> frozenset[int]:
    """Ranks the recovery under way restores that have not reported loading its state (none when no
    recovery is under way); every rank while the catalog holds no progress at all: no rank's state is
    known, so no plan keeps one (a localized replay would keep survivors at a step nobody reported)."""
    if not facts.progress.latest and record.state_step > 0:
        return frozenset(range(world))
    plan = record.plan
    if record.phase != "Recovering" or plan is None or plan.generation != record.generation:
        return frozenset()
    return frozenset(plan.restore_ranks) - facts.progress.loaded_in(record.generation)


def _job_state(record: Record, observed: Observed, facts: CatalogFacts, layout: LayoutSpec, now: float) -> JobState:
    cooling = {n: t for n, t in record.cool_downs.items() if t > now}
    return JobState(
        layout=layout,
        node_of_rank=tuple(n or "" for n in observed.node_of_rank),
        cluster=ClusterState(nodes=observed.cluster.nodes, cool_downs=tuple(sorted(cooling.items()))),
        step=_known_step(record, facts),
        generation=record.generation,
        restarts=record.restarts,
        holdings=facts.holdings,
        latest_complete_step=facts.complete_step,
        upstream_logs=facts.upstream_logs,
        stored_windows=facts.stored_windows,
        interrupted=record.plan.action if record.phase == "Recovering" and record.plan is not None else None,
        unloaded=_unloaded(record, facts, layout.world_size),
        resharded_from=record.plan.restore_step if record.plan is not None
        and record.plan.action is RecoveryAction.RESHARD else None,
    )


def decide(spec: TrainingJobSpec, record: Record, observed: Observed, *, now: float,
           settle: Settle | None = None) -> Decision:
    """The job's next phase and, when something failed, the recovery plan (rules in the module docstring).

    Args:
        spec: the validated TrainingJob spec.
        record: what the runner remembers of the job.
        observed: what the runner observed this round.
        now: seconds since the epoch (grace periods, cool-downs and hangs compare against it).
        settle: plan only once the job is quiet (``lifeline run``, whose rounds are 50 ms apart).

    Returns:
        The :class:`Decision`; equal inputs give equal decisions (a round interrupted at any point
        is simply repeated).

    Raises:
        ConfigError: ``observed.node_of_rank`` does not match the current layout's world size.
    """
    decision = _decide(spec, record, observed, now=now, settle=settle)
    facts = observed.catalog
    return replace(decision, state_step=record.state_step if facts is None else _known_step(record, facts))


def _decide(spec: TrainingJobSpec, record: Record, observed: Observed, *, now: float,
            settle: Settle | None) -> Decision:
    layout = record.layout(spec)
    world = layout.world_size
    g = record.generation
    facts = observed.catalog
    progress = facts.progress if facts is not None else Progress()
    base = {"generation": g, "layout": layout}
    if observed.finished or (facts is not None and progress.done_ranks >= set(range(world))):
        return Decision("Succeeded", "TrainingComplete", f"all {world} ranks finished {spec.steps} steps",
                        resumed=record.phase == "Recovering", **base)

    signals = [*observed.signals, *_catalog_signals(spec, record, observed, world, now)]
    failures = classify(signals, node_of_rank=observed.node_of_rank,
                        hang_timeout_seconds=spec.recovery.hang_timeout_seconds)
    if failures:
        if facts is None:  # a plan needs the holdings: wait for the catalog rather than plan blind
            return Decision(record.phase, "CatalogUnavailable", f"failures seen ({failures[0].describe()}); "
                            "waiting for the catalog to plan the recovery", failures=failures, settling=True, **base)
        if _catalog_emptied(spec, observed, facts, now):  # plan with the copies, not an empty catalog
            return Decision(record.phase, "CatalogRebuilding", f"failures seen ({failures[0].describe()}); no "
                            "sidecar is registered although sidecars run (the catalog's Redis came back empty): "
                            "waiting for them to register their copies", failures=failures, settling=True, **base)
        if settle is not None and not settle.quiet and now - settle.since < SETTLE_SECONDS:
            return Decision(record.phase, record.reason or record.phase, record.message, failures=failures,
                            settling=True, **base)
        plan = plan_recovery(_job_state(record, observed, facts, layout, now), failures, spec, now=now)
        plan = annotate(plan, preempted(progress, g))  # a preemption says so in the plan's reason
        if plan.action is RecoveryAction.GIVE_UP:
            return Decision("Failed", "GiveUp", plan.reason, failures=failures, plan=plan, **base)
        return Decision("Recovering", plan.action.value, plan.reason, plan.generation, plan.layout,
                        failures=failures, plan=plan)

    if record.phase == "Recovering":
        if facts is not None and facts.generation >= g and progress.trained_in(g, world):
            return Decision("Running", "Recovered", f"training resumed in generation {g} at step {progress.step}",
                            resumed=True, **base)
        return Decision("Recovering", record.reason or "Recovering", record.message, **base)
    unready = [r for r in range(world) if r not in observed.ready]
    if record.phase == "Running" and facts is not None and facts.generation == g and progress.trained_in(g, world) \
            and None not in observed.node_of_rank:
        grow = plan_grow(_job_state(record, observed, facts, layout, now), spec, now=now)
        if grow is not None:  # room came back: the spec's size again (nothing failed, no restart counted)
            return Decision("Recovering", grow.action.value, grow.reason, grow.generation, grow.layout, plan=grow)
    if not unready or record.phase == "Running":
        return Decision("Running", "AllRanksReady", f"{world} ranks running, step {progress.step}", **base)
    return Decision("Pending", "PodsStarting", f"waiting for the pods of ranks {unready} to be Ready", **base)
