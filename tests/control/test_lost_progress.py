"""A catalog that lost the trainers' progress (its Redis came back empty) does not make the engine
forget where the ranks' states are, and the latest complete step does not move backwards.

Fuzz seed 2 of ``lifeline bench fuzz --model pipelining-moe``: an L2 flip took both nodes down and Redis
restarted empty in the same round. The repaired catalog listed L2 copies of steps 2 and 4, but the
engine caps every copy at the step the ranks' states are at, read from the progress that was gone,
so it read 0 and rolled back to the initial state; the complete step then read 1 after 4."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import yaml

from lifeline.api import RecoveryAction, load_trainingjob
from lifeline.catalog import ProgressReport
from lifeline.control import (CatalogFacts, ClusterState, ContainerTerminated, Holding, NodeCondition, NodeState, Observed, Progress,
                              Record, SidecarState, decide)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
T = 1_000_000.0
NODES = ("n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7")
WORLD = 4


def _spec():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"].update(startupGraceSeconds=60)
    return load_trainingjob(body).spec


def _observed(lost: tuple[str, ...], l2_steps: tuple[int, ...], reports: list[ProgressReport]) -> Observed:
    """Ranks 0..3 on n0..n3, the nodes in ``lost`` NotReady (their sidecars gone), L2 copies of every
    rank at ``l2_steps`` (the repaired catalog's seeded holdings), the trainers' ``reports``."""
    holdings = frozenset(h for step in l2_steps for h in Holding.complete(step, WORLD))
    alive = [r for r in range(WORLD) if NODES[r] not in lost]
    return Observed(
        node_of_rank=NODES[:WORLD],
        cluster=ClusterState(tuple(NodeState(n, capacity=1, ready=n not in lost) for n in NODES)),
        signals=tuple(NodeCondition(n, ready=False) for n in lost),
        sidecars=tuple(SidecarState(r, NODES[r], T - 100, T) for r in alive),
        ready=frozenset(alive),
        catalog=CatalogFacts(generation=1, progress=Progress.of(reports, 1),
                             registered={r: NODES[r] for r in alive}, holdings=holdings))


def test_with_no_progress_left_the_engine_plans_from_the_step_it_last_saw():
    """Drawn: which nodes are lost, the step the ranks were at and the L2 steps below it; the plan
    restores the newest L2 step at or below the last state step seen, never the initial state."""
    rng = random.Random(2)
    spec = _spec()
    for _ in range(6):
        lost = tuple(sorted(rng.sample(NODES[:WORLD], rng.randint(1, WORLD))))
        seen = rng.randint(3, 9)
        l2 = tuple(sorted(rng.sample(range(1, seen + 1), 2)))
        wiped = _observed(lost, l2, reports=[])
        d = decide(spec, Record(phase="Running", generation=1, state_step=seen), wiped, now=T)
        assert d.plan is not None and d.plan.restore_step == max(l2), (lost, seen, l2, d.plan)
        assert d.state_step == seen
        # the bug: a state step of 0 keeps no copy, and everything starts over
        old = decide(spec, Record(phase="Running", generation=1), wiped, now=T)
        assert old.plan is not None and old.plan.restore_step is None
    # with progress, the progress decides (a rollback's lower step is not overruled by the record)
    reports = [ProgressReport("step", "j", r, 1, T - 1, 2) for r in range(WORLD)]
    d = decide(spec, Record(phase="Running", generation=1, state_step=6), _observed(("n1",), (2, 4), reports), now=T)
    assert d.plan is not None and d.plan.restore_step == 2 and d.state_step == 2


def test_with_no_progress_left_no_plan_keeps_a_rank_s_state():
    """No rank's state is known: a trainer crash is answered by a plan that restores every rank."""
    spec = _spec()
    spec = spec.model_copy(update={"recovery": spec.recovery.model_copy(update={"localized_replay": True})})
    wiped = _observed((), (2, 4), reports=[])
    crashed = replace(wiped, signals=(ContainerTerminated(3, "n3", "trainer", 137, "Killed"),))
    d = decide(spec, Record(phase="Running", generation=1, state_step=4), crashed, now=T)
    assert d.plan is not None and d.plan.action is not RecoveryAction.LOCALIZED_REPLAY
    assert set(d.plan.restore_ranks) == set(range(WORLD)) and d.plan.restore_step == 4


def test_the_complete_step_is_restored_and_never_lowered(catalog):
    """``restore_complete_step`` (the launcher's repair after an empty Redis) on a real Redis."""
    assert catalog.latest_complete_step() is None
    catalog.try_advance([3], "L0", rank=0, floor=3)  # a floor collected while no step is set
    assert catalog.restore_complete_step(4) == 4 and catalog.latest_complete_step() == 4
    assert catalog.restore_complete_step(2) == 4 and catalog.latest_complete_step() == 4
    for rank in range(catalog.world_size):
        catalog.add_holding(5, rank, "L0", rank)
    assert catalog.try_advance([5], "L0", rank=1) == 5  # advancing goes on from the restored step
    assert catalog.try_advance([4], "L0", rank=2) == 5
