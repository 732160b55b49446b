"""Plan a recovery: the cheapest rung of DESIGN.md's ladder that the surviving copies allow.

:func:`plan_recovery` is pure: it reads a :class:`~lifeline.control.state.JobState`, the
classified failures and the spec, and returns a frozen :class:`RecoveryPlan` that the operator
(or the local launcher) applies. The rules, in order (docs/control.md gives the reasoning):

1. ``GiveUp`` when ``status.restarts`` already reached ``spec.recovery.maxRestarts``.
2. ``Reshard`` when the ranks that lost their pod cannot all be placed on healthy nodes (no
   free capacity outside cool-down) and ``spec.recovery.elastic`` allows a smaller world:
   fewer replica groups (data degree), world size >= ``minReplicas``
   (:func:`lifeline.control.elastic.plan_shrink`; growing back is
   :func:`~lifeline.control.elastic.plan_grow`, which the engine asks when nothing failed).
3. ``RestartInPlace`` when no pod was lost: every rank reloads the latest step held in
   sidecar memory (its own L0, else a peer's L1); only the dead trainers are restarted.
4. ``ReplacePods`` when pods were lost but every rank still has a memory copy (L0 of
   survivors, L1 of the lost ranks on healthy peers) of a common step.
5. ``LocalizedReplay`` (after MoEvement) — tried before rules 3 and 4 when
   ``spec.recovery.localizedReplay`` is on — when the failed ranks all sit in one pipeline stage,
   the stage's ranks hold a copy of a common step (any tier), and the upstream logs of their
   neighbours cover every step from it to the current step: only that stage restores and
   replays; the other stages keep their state and recompute nothing. Not while a localized
   replay is under way: a failure during one falls back to the global rungs.
6. ``Rollback`` of every rank to the latest step covered by any tier (usually L2).
7. ``GiveUp`` when no step has a verified copy of every shard.

A step is *covered* when every rank's shard at that step has a verified holding whose holder
is alive (L0: the rank's own sidecar survived; L1: the holding peer survived; L2: always).
Per rank the nearest tier wins (L0, then L1, then L2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from lifeline.api.recovery import (
    TIERS,
    Failure,
    FailureKind,
    PodPlacement,
    RecoveryPlan,
    RestoreSource,
    Tier,
)
from lifeline.api.trainingjob import LayoutSpec, RecoveryAction, TrainingJobSpec
from lifeline.control.elastic import latest_covered, place, plan_shrink, usable_holdings, with_nodes
from lifeline.control.placement import place_replicas
from lifeline.control.state import JobState, UpstreamLog, stage_of
from lifeline.errors import ConfigError, RecoveryError

__all__ = ["RestoreSource", "PodPlacement", "RecoveryPlan", "plan_recovery"]


def plan_recovery(
    state: JobState,
    failures: Iterable[Failure],
    spec: TrainingJobSpec,
    *,
    now: float,
) -> RecoveryPlan:
    """Choose the cheapest recovery the surviving copies allow (rules in the module docstring).

    Args:
        state: the job and cluster as observed (node of each rank, holdings, cool-downs, ...).
        failures: from :func:`lifeline.control.classify` (at least one).
        spec: the TrainingJob spec (recovery and checkpoint settings).
        now: the current time, seconds since the epoch; cool-downs expire relative to it.

    Returns:
        A :class:`RecoveryPlan`. Deterministic: equal inputs give equal plans.

    Raises:
        RecoveryError: ``failures`` is empty (there is nothing to recover from) or names a rank
            outside the world size.
    """
    failures = tuple(failures)
    if not failures:
        raise RecoveryError("plan_recovery needs at least one failure; nothing to recover from")
    rec = spec.recovery
    world = state.world_size
    outside = sorted({r for f in failures for r in f.ranks if not 0 <= r < world})
    if outside:
        raise RecoveryError(f"failures name ranks {outside} outside world size {world}", rank=outside[0])
    cool = state.cluster.cooling(now)
    known = {n.name for n in state.cluster.nodes}
    unready = {n.name for n in state.cluster.nodes if not n.ready}
    failed_nodes = {f.node for f in failures if f.kind.loses_memory and f.node is not None}
    if rec.node_cooldown_seconds > 0:
        for node in failed_nodes:
            cool[node] = max(cool.get(node, now), now + rec.node_cooldown_seconds)
    lost = {r for f in failures if f.kind.loses_memory for r in f.ranks}
    lost |= {r for r, n in enumerate(state.node_of_rank) if n in unready or n not in known}
    if lost:  # the logs these sidecars held die with them (the plan's memory_lost_ranks; fuzz seed 3089)
        state = replace(state, upstream_logs=UpstreamLog.after_losing(state.upstream_logs, lost))
    hang = any(f.kind is FailureKind.HANG for f in failures)
    restart = set(range(world)) - lost if hang else {r for f in failures for r in f.ranks} - lost
    avoid = set(cool) | failed_nodes | unready
    what = "; ".join(f.describe() for f in failures)
    common = {
        "generation": state.generation + 1,
        "restarts": state.restarts + 1,
        "cool_downs": tuple(sorted(cool.items())),
        "failures": failures,
    }

    def give_up(why: str) -> RecoveryPlan:
        return RecoveryPlan(
            action=RecoveryAction.GIVE_UP, restore_step=None, layout=state.layout, node_of_rank=state.node_of_rank,
            restore_ranks=(), sources=(), restart_ranks=(), create_pods=(), delete_ranks=(),
            reason=f"{what}; giving up: {why}", **{**common, "restarts": state.restarts},
        )

    if state.restarts >= rec.max_restarts:
        return give_up(f"spec.recovery.maxRestarts ({rec.max_restarts}) reached; raise it to keep recovering")

    staying = {r: state.node_of_rank[r] for r in range(world) if r not in lost}
    placed = place(sorted(lost), staying, state, avoid)
    unplaced = [r for r, node in placed.items() if node is None]
    if unplaced and rec.elastic is not None:
        plan = plan_shrink(state, spec, lost, avoid, what=what, **common)
        if plan is not None:
            return plan
    node_of_rank = tuple(placed.get(r, state.node_of_rank[r]) for r in range(world))
    create = tuple(PodPlacement(r, placed[r]) for r in sorted(lost))
    wait = f"; ranks {unplaced} wait for a node with room" if unplaced else ""
    everyone = tuple(range(world))

    def plan(action: RecoveryAction, step: int | None, sources: dict[int, RestoreSource], ranks: tuple[int, ...],
             why: str, replay_to: int | None = None, window: int | None = None) -> RecoveryPlan:
        return RecoveryPlan(
            action=action, restore_step=step, layout=state.layout, node_of_rank=node_of_rank,
            restore_ranks=ranks, sources=with_nodes(sources, state.node_of_rank),
            restart_ranks=tuple(sorted(restart)), create_pods=create, delete_ranks=(),
            reason=f"{what}; {why}{wait}", replay_to_step=replay_to, restore_window=window, **common,
        )

    usable = usable_holdings(state, lost)
    replay = _localized_replay(state, spec, lost | restart, usable, hang, lost)
    if replay is not None:
        step, src, ranks, stage, window = replay
        copy = "the sparse window starting at" if window is not None else "step"
        steps = f"replay steps {step + 1}..{state.step} from the upstream logs of " \
                f"{_stage_names(stage, state.layout.pipeline)}" if step < state.step else \
                "replay nothing (the copy is of the current step)"
        return plan(RecoveryAction.LOCALIZED_REPLAY, step, src, ranks,
                    f"only stage {stage} failed: ranks {list(ranks)} restore {copy} {step} ({_farthest(src)}) and "
                    f"{steps}; the other stages keep their state", replay_to=state.step, window=window)
    mem_step, mem_src = latest_covered(everyone, usable, ("L0", "L1"), state.step)
    any_step, any_src = latest_covered(everyone, usable, TIERS, state.step)
    window = _latest_window(everyone, {log.rank: log for log in state.upstream_logs}, spec, state.step)
    if window is not None and not _slots_survive(everyone, lost, state, spec):
        window = None
    stored = _latest_stored_window(everyone, state, spec)
    if stored is not None and all(s is None or stored > s for s in (mem_step, any_step, window)):
        src = {r: RestoreSource(r, "L2", None, None) for r in everyone}
        end = stored + spec.checkpoint.sparse.window - 1
        return plan(RecoveryAction.ROLLBACK, stored, src, everyone,
                    f"memory tiers do not hold a newer copy; every rank's sparse window of steps {stored}..{end} is "
                    f"committed to L2, newer than any dense copy: all ranks restore its first slot from L2 and "
                    f"re-run to step {state.step}, applying its slots up to step {end} (sparse-to-dense conversion)",
                    window=spec.checkpoint.sparse.window)
    if window is not None and all(s is None or window > s for s in (mem_step, any_step)):
        src = {r: RestoreSource(r, "L1" if r in lost else "L0", None if r in lost else r, None) for r in everyone}
        end = window + spec.checkpoint.sparse.window - 1
        why = (f"every rank holds the sparse window of steps {window}..{end} in memory, newer than any dense copy; "
               f"all ranks restore its first slot and re-run to step {state.step}, applying its slots up to step "
               f"{end} (online sparse-to-dense conversion)")
        w = spec.checkpoint.sparse.window
        if not lost:
            return plan(RecoveryAction.RESTART_IN_PLACE, window, src, everyone, f"{why}; restarting trainers "
                        f"{sorted(restart)} in place", window=w)
        return plan(RecoveryAction.REPLACE_PODS, window, src, everyone,
                    f"{why}; replacing pods of ranks {sorted(lost)}", window=w)
    if mem_step is not None and (any_step is None or mem_step >= any_step):
        if not lost:
            return plan(RecoveryAction.RESTART_IN_PLACE, mem_step, mem_src, everyone,
                        f"every rank's sidecar memory holds step {mem_step}; restarting trainers {sorted(restart)} "
                        "in place")
        return plan(RecoveryAction.REPLACE_PODS, mem_step, mem_src, everyone,
                    f"replacing pods of ranks {sorted(lost)}; survivors reload step {mem_step} from L0, "
                    "the lost ranks from peer copies (L1)")
    if any_step is not None:
        return plan(RecoveryAction.ROLLBACK, any_step, any_src, everyone,
                    f"memory tiers do not cover every rank; all ranks roll back to step {any_step}, the latest "
                    f"step every shard has a verified copy of (farthest tier {_farthest(any_src)})")
    if state.resharded_from is not None:  # the new layout has no step of its own yet: reshard that one again
        return plan(RecoveryAction.ROLLBACK, state.resharded_from, {}, everyone,
                    f"no step of layout {state.layout.to_wire()} is covered yet; all ranks restore step "
                    f"{state.resharded_from} again, resharded from the sidecars that still hold it or from L2, as "
                    f"the elastic reshard that made this layout did")
    # the initial state is the one copy nothing can corrupt: a seeded trainer computes it again
    return plan(RecoveryAction.ROLLBACK, None, {}, everyone,
                "no step has a verified copy of every shard in any tier (L0, L1, L2): all ranks start over "
                "from the initial state")


def _farthest(sources: dict[int, RestoreSource]) -> Tier:
    return max((s.tier for s in sources.values()), key=TIERS.index)


def _localized_replay(
    state: JobState, spec: TrainingJobSpec, failed: set[int], usable: dict, hang: bool, lost: set[int] = frozenset()
) -> tuple[int, dict[int, RestoreSource], tuple[int, ...], int, int | None] | None:
    """``(step, sources, replay ranks, stage, window)`` when one stage can restore and replay alone
    (``window``: W when the step is the start of a sparse window, ``None`` for a dense copy): the
    failed ranks all sit in one stage, its ranks (the stage's replica group) hold a copy of a common
    step — a dense checkpoint, or with sparse checkpoints the start of a complete window
    (:func:`_latest_window`), whichever is later — and every neighbour of every one of them logged
    the steps from there to the current one. Never while a localized replay is under way (a
    failure during one falls back to the ladder's global rungs), nor while a rank outside the stage
    has not loaded the state of the recovery under way (:attr:`JobState.unloaded`)."""
    layout = state.layout
    if not spec.recovery.localized_replay or layout.pipeline < 2 or hang or not failed:
        return None
    if state.interrupted is RecoveryAction.LOCALIZED_REPLAY:
        return None
    stages = {stage_of(r, layout) for r in failed}
    if len(stages) != 1:
        return None
    stage = stages.pop()
    ranks = tuple(r for r in range(state.world_size) if stage_of(r, layout) == stage)
    if state.unloaded - set(ranks):  # a rank outside the stage has not loaded the recovery under way's
        return None                  # state: nothing to keep (fuzz seed 85756845)
    step, sources = latest_covered(ranks, usable, TIERS, state.step)
    chosen: int | None = None  # W when a window is the copy restored; a dense copy of an equal step wins
    logs = {log.rank: log for log in state.upstream_logs}
    window = _latest_window(ranks, logs, spec, state.step)
    if window is not None and (step is None or window > step) and _slots_survive(ranks, lost, state, spec):
        step, chosen = window, spec.checkpoint.sparse.window  # slots live in the log store: the lost
        sources = {r: RestoreSource(r, "L1" if r in lost else "L0", None if r in lost else r, None) for r in ranks}
    stored = _latest_stored_window(ranks, state, spec)  # (ranks' copies are their L1 peers')
    if stored is not None and (step is None or stored > step):
        step, chosen = stored, spec.checkpoint.sparse.window  # the slots are read from L2 (memory copies gone)
        sources = {r: RestoreSource(r, "L2", None, None) for r in ranks}
    if step is None:
        return None
    for rank in ranks:
        for neighbour in _neighbours(rank, layout):
            log = logs.get(neighbour)
            if step < state.step and (log is None or not log.covers(step + 1, state.step)):
                return None
    return step, sources, ranks, stage, chosen


def _latest_window(ranks: Sequence[int], logs: dict[int, UpstreamLog], spec: TrainingJobSpec, step: int
                   ) -> int | None:
    """The start of the latest sparse window (MoEvement §4) whose W slots every rank of ``ranks``
    still holds, ending at or before ``step``; ``None`` without sparse checkpoints or such a window.

    A rank's slots are kept with its upstream log (steps ``first_step``..``last_step`` of its
    coverage); windows start at multiples of W and the one at step 0 has no slot 0 (the initial
    state is not captured)."""
    sparse = spec.checkpoint.sparse
    if sparse is None or any(r not in logs for r in ranks):
        return None
    w = sparse.window
    first = max(logs[r].first_step for r in ranks)
    last = min(min(logs[r].last_step for r in ranks), step)
    start = (last + 1) // w * w - w  # the latest window whose last slot (start + W - 1) <= last
    if start < max(first, w):
        return None
    return start


def _slots_survive(ranks: Sequence[int], lost: set[int], state: JobState, spec: TrainingJobSpec) -> bool:
    """Whether the memory copies of the slots of every rank of ``ranks`` survive: a lost rank's
    slots are held only by its L1 peers (Gemini placement), so one of them must not be lost too."""
    if not lost & set(ranks):
        return True
    try:
        peers = place_replicas(state.node_of_rank, spec.checkpoint.peer_replicas)
    except ConfigError:  # too few nodes for the replicas: no L1 copy exists
        return False
    return all(any(p not in lost for p in peers[r]) for r in ranks if r in lost)


def _latest_stored_window(ranks: Sequence[int], state: JobState, spec: TrainingJobSpec) -> int | None:
    """The start of the latest sparse window committed to L2 by every rank of ``ranks`` (all its W
    slots ending at or before the current step), or ``None``."""
    sparse = spec.checkpoint.sparse
    if sparse is None:
        return None
    w = sparse.window
    stored = {s.rank: s for s in state.stored_windows if s.window == w}
    if any(r not in stored for r in ranks):
        return None
    common = set.intersection(*(set(stored[r].starts) for r in ranks)) if ranks else set()
    starts = [s for s in common if 0 < s and s + w - 1 <= state.step]
    return max(starts, default=None)


def _stage_names(stage: int, stages: int) -> str:
    """The neighbours of ``stage`` among ``stages`` pipeline stages, in words ("stages 0 and 2", "stage 1")."""
    named = [s for s in (stage - 1, stage + 1) if 0 <= s < stages]
    return f"stage {named[0]}" if len(named) == 1 else f"stages {named[0]} and {named[1]}"


def _neighbours(rank: int, layout: LayoutSpec) -> tuple[int, ...]:
    """The ranks that exchange pipeline tensors with ``rank``: same position in the stages before and
    after (the pipeline degree is the slowest-varying in the rank order, see :func:`stage_of`)."""
    per_stage = layout.tensor * layout.expert * layout.data
    stage = stage_of(rank, layout)
    return tuple(rank + (s - stage) * per_stage for s in (stage - 1, stage + 1) if 0 <= s < layout.pipeline)
