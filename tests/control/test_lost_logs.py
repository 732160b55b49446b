"""Upstream-log entries that died with two failures are never planned from: each sidecar holds its
rank's log and the replicas of its peers' logs, and a plan that declares a sidecar's memory lost
lowers, in the real Redis catalog, the coverage of every log whose original and replica have both died
since (fuzz seed 3089: pipeline 2; rank 0's node was lost, so its log of steps 6..9 lived only as a
replica in rank 1's sidecar; then rank 1's sidecar was killed and stage 1's replay from step 6 was
planned from that log: `upstream log ... of rank 0 is not held anywhere`, and a Rollback followed)."""

from __future__ import annotations

import random
from dataclasses import replace

from lifeline.api import LayoutSpec, RecoveryAction
from lifeline.api.recovery import RecoveryPlan
from lifeline.catalog import LogCoverage
from lifeline.control import ContainerTerminated, Failure, FailureKind, UpstreamLog, classify, plan_recovery

from tests.control.test_control_plan import NODE_OF_RANK, NOW, _holdings, _spec, _state

LAYOUT = LayoutSpec(pipeline=2, data=2)  # ranks 0, 1: stage 0; ranks 2, 3: stage 1


def _losing(generation: int, *ranks: int) -> RecoveryPlan:
    """A plan of ``generation`` answering the loss of the sidecars of ``ranks`` (nothing else lost)."""
    plan = RecoveryPlan.restore_all(generation, 9, LAYOUT, action=RecoveryAction.REPLACE_PODS)
    failures = tuple(Failure(FailureKind.SIDECAR_LOST, (r,), f"n{r}", "sidecar gone") for r in ranks)
    return replace(plan, create_pods=(), failures=failures)


def _coverage(catalog) -> dict[int, tuple[int, int]]:
    return {c.rank: (c.first_step, c.last_step) for c in catalog.log_coverage()}


def test_a_log_whose_original_and_replica_died_in_two_failures_is_no_longer_covered(catalog):
    for rank in range(4):
        catalog.record_log_coverage(LogCoverage(rank, 6, 9))
    first = _losing(1, 0)
    assert first.memory_lost_ranks == (0,)
    catalog.put_plan(first)
    assert _coverage(catalog) == {r: (6, 9) for r in range(4)}  # each entry still has one copy

    # the trainers went on to step 11; rank 0's replacement counts from the first step it read back
    for rank in range(4):
        catalog.record_log_coverage(LogCoverage(rank, 6, 11))
    catalog.put_plan(_losing(2, 2))
    # rank 0: originals of 6..9 died first, their replica now may have; ranks 1 and 3: replicas died
    # first (on rank 0), originals live on; rank 2: its originals die now, replicas of 6..9 died first
    assert _coverage(catalog) == {0: (10, 11), 1: (6, 11), 2: (10, 11), 3: (6, 11)}

    # a trainer that kept running reports its old first step: the catalog starts it after the floor
    assert catalog.record_log_coverage(LogCoverage(0, 6, 12))
    assert catalog.record_log_coverage(LogCoverage(1, 6, 12))
    assert _coverage(catalog)[0] == (10, 12) and _coverage(catalog)[1] == (6, 12)
    assert not catalog.record_log_coverage(LogCoverage(2, 6, 9))  # nothing above the floor
    assert 2 not in _coverage(catalog)

    # the same plan stored again (a Redis restart, a retried write) lowers nothing more
    catalog.put_plan(_losing(2, 2))
    assert _coverage(catalog)[1] == (6, 12)


def test_a_log_kept_without_replicas_dies_with_its_sidecar(catalog):
    catalog.record_log_coverage(LogCoverage(0, 6, 9, replicas=0))
    catalog.record_log_coverage(LogCoverage(1, 6, 9, replicas=0))
    catalog.put_plan(_losing(1, 0))
    assert _coverage(catalog) == {1: (6, 9)}
    assert catalog.record_log_coverage(LogCoverage(0, 6, 11, replicas=0))
    assert _coverage(catalog)[0] == (10, 11)


def test_the_plan_answering_the_second_loss_does_not_replay_from_the_log_it_loses(catalog):
    """Seed 3089 as the planner sees it: stage 0's node was lost (generation 1); now stage 1's sidecars
    die, and stage 1's newest copy is of step 6. The log of stage 0 from step 7 on is needed; its
    entries up to step 9 lived only as replicas, in the sidecars that die now. The plan is made
    before the catalog records that loss, so the planner applies it itself: no localized replay."""
    for rank in range(4):
        catalog.record_log_coverage(LogCoverage(rank, 6, 9))
    catalog.put_plan(_losing(1, 0))  # rank 0's node (stage 0)
    for rank in range(4):
        catalog.record_log_coverage(LogCoverage(rank, 6, 11))
    logs = tuple(UpstreamLog(c.rank, c.first_step, c.last_step, c.replicas, c.originals_lost_to,
                             c.replicas_lost_to) for c in catalog.log_coverage())
    assert [(log.first_step, log.originals_lost_to, log.replicas_lost_to) for log in logs] == [
        (6, 9, -1), (6, -1, 9), (6, -1, 9), (6, -1, 9)]
    gone = classify([ContainerTerminated(r, f"n{r}", "sidecar", 137) for r in (2, 3)], node_of_rank=NODE_OF_RANK,
                    hang_timeout_seconds=300)
    holdings = _holdings(memory_steps=(), l2_steps=(6,))
    state = replace(_state(holdings, step=11, logs=logs), latest_complete_step=6)
    plan = plan_recovery(state, gone, _spec(localizedReplay=True), now=NOW)
    assert plan.memory_lost_ranks == (2, 3)
    assert plan.action is not RecoveryAction.LOCALIZED_REPLAY, plan.reason
    # without the earlier loss (no marks), the same failure replays stage 1 from stage 0's log
    fresh = tuple(UpstreamLog(r, 6, 11) for r in range(4))
    plan = plan_recovery(replace(state, upstream_logs=fresh), gone, _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY and plan.restore_step == 6
    # and the catalog, storing the plan, records what the planner assumed
    catalog.put_plan(_losing(2, 2, 3))
    # rank 0: originals to 9 died first, replicas now; rank 1: only replicas died; ranks 2 and 3 died
    # together, each possibly holding the other's replicas
    assert _coverage(catalog) == {0: (10, 11), 1: (6, 11)}


def test_the_planner_and_the_catalog_apply_the_same_rule_to_drawn_failure_sequences(catalog):
    """The planner's :meth:`UpstreamLog.after_losing` (what a plan assumes) and the catalog's script
    (what is recorded once the plan is stored) agree on 40 drawn sequences of logs, replica counts and
    sidecar deaths, across generations."""
    rng = random.Random(3089)
    for case in range(40):
        catalog.wipe()
        generation = 0
        for _ in range(rng.randint(1, 4)):
            for rank in range(4):  # the trainers log on (some with stale first steps)
                if rng.random() < 0.8:
                    first = rng.randint(0, 6)
                    catalog.record_log_coverage(LogCoverage(rank, first, first + rng.randint(0, 8),
                                                            replicas=rng.choice((0, 1, 1))))
            before = tuple(UpstreamLog(c.rank, c.first_step, c.last_step, c.replicas, c.originals_lost_to,
                                       c.replicas_lost_to) for c in catalog.log_coverage())
            dead = rng.sample(range(4), rng.randint(1, 2))
            expected = UpstreamLog.after_losing(before, dead)
            generation += 1
            catalog.put_plan(_losing(generation, *dead))
            after = tuple(UpstreamLog(c.rank, c.first_step, c.last_step, c.replicas, c.originals_lost_to,
                                      c.replicas_lost_to) for c in catalog.log_coverage())
            assert after == expected, f"case {case}: {before} losing {dead}"
