"""Elastic resharding both ways (``lifeline.control.elastic``): shrink from memory, grow back when room returns."""

from __future__ import annotations

from pathlib import Path

import yaml

from lifeline.api import LayoutSpec, RecoveryAction, load_trainingjob
from lifeline.control import (
    CatalogFacts,
    ClusterState,
    Holding,
    JobState,
    NodeState,
    Observed,
    Progress,
    Record,
    decide,
    place_replicas,
)
from lifeline.control.elastic import plan_grow
from lifeline.catalog import ProgressReport

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
NOW = 1_000_000.0
SMALL = LayoutSpec(pipeline=2, data=1)  # the example shrunk to one replica group


def _spec(**recovery):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"].update(recovery)
    return load_trainingjob(body).spec


def _memory(steps, node_of_rank):
    peers = place_replicas(list(node_of_rank), 1) if len(node_of_rank) > 1 else {0: ()}
    out = set()
    for step in steps:
        for rank in range(len(node_of_rank)):
            out.add(Holding(step, rank, "L0", rank))
            out |= {Holding(step, rank, "L1", p) for p in peers[rank]}
    return frozenset(out)


def _nodes(*ready, capacity=1):
    return tuple(NodeState(f"n{i}", ready=i in ready, capacity=capacity) for i in range(4))


def _state(nodes, node_of_rank=("n0", "n2"), steps=(50, 51), cool_downs=()):
    return JobState(layout=SMALL, node_of_rank=node_of_rank, cluster=ClusterState(nodes, cool_downs), step=51,
                    generation=2, restarts=1, holdings=_memory(steps, node_of_rank), latest_complete_step=51)


def test_grows_back_to_the_spec_when_two_nodes_have_room():
    plan = plan_grow(_state(_nodes(0, 1, 2, 3)), _spec(), now=NOW)
    assert plan is not None and plan.action is RecoveryAction.RESHARD
    assert plan.layout == LayoutSpec(pipeline=2, data=2) and plan.generation == 3
    assert plan.restarts == 1 and plan.failures == ()  # nothing failed: no restart counted
    # both pods stay (they adopt the new layout in place); two new ranks on the free nodes
    assert plan.restart_ranks == (0, 1) and plan.delete_ranks == ()
    assert [(p.rank, p.node) for p in plan.create_pods] == [(2, "n1"), (3, "n3")]
    assert plan.node_of_rank == ("n0", "n2", "n1", "n3")
    # at the latest step both ranks hold in memory, read from their own sidecars
    assert plan.restore_step == 51 and [(s.rank, s.tier, s.holder) for s in plan.sources] == [
        (0, "L0", 0), (1, "L0", 1)]
    assert "growing from data degree 1 to 2" in plan.reason


def test_does_not_grow_without_room_or_elasticity_or_while_the_node_cools_down():
    assert plan_grow(_state(_nodes(0, 2)), _spec(), now=NOW) is None  # the others are not ready
    assert plan_grow(_state(_nodes(0, 1, 2)), _spec(), now=NOW) is None  # room for one pod, a group needs two
    cooling = (("n1", NOW + 60), ("n3", NOW + 60))
    assert plan_grow(_state(_nodes(0, 1, 2, 3), cool_downs=cooling), _spec(), now=NOW) is None
    assert plan_grow(_state(_nodes(0, 1, 2, 3), cool_downs=cooling), _spec(), now=NOW + 61) is not None
    body = yaml.safe_load(EXAMPLE.read_text())
    del body["spec"]["recovery"]["elastic"]
    assert plan_grow(_state(_nodes(0, 1, 2, 3)), load_trainingjob(body).spec, now=NOW) is None


def test_grow_needs_a_step_every_rank_holds_in_memory():
    state = _state(_nodes(0, 1, 2, 3), steps=())
    assert plan_grow(state, _spec(), now=NOW) is None


def _observed(nodes, step=51, generation=2):
    reports = {r: ProgressReport("step", "gpt-moe", r, generation, NOW - 1, step, {}) for r in range(2)}
    facts = CatalogFacts(generation=generation, progress=Progress.of(reports.values(), generation),
                         registered={0: "n0", 1: "n2"}, holdings=_memory((50, 51), ("n0", "n2")), complete_step=51)
    return Observed(node_of_rank=("n0", "n2"), cluster=ClusterState(nodes), ready=frozenset({0, 1}),
                    catalog=facts)


def test_the_engine_grows_a_running_job_once_room_returns():
    spec = _spec()
    shrink = plan_grow(_state(_nodes(0, 1, 2, 3)), spec, now=NOW)  # any plan with the small layout will do
    record = Record(phase="Running", generation=2, restarts=1,
                    plan=shrink.__class__(**{**shrink.__dict__, "layout": SMALL, "generation": 2}))
    # no room: keeps running in the small layout
    d = decide(spec, record, _observed(_nodes(0, 2)), now=NOW)
    assert (d.phase, d.plan, d.layout) == ("Running", None, SMALL)
    # room again: a Reshard plan to the spec's size, no failures
    d = decide(spec, record, _observed(_nodes(0, 1, 2, 3)), now=NOW)
    assert d.phase == "Recovering" and d.plan is not None and d.plan.action is RecoveryAction.RESHARD
    assert d.layout == spec.layout and d.failures == () and d.generation == 3
    # never in the middle of a recovery (the current generation has not trained yet)
    recovering = Record(phase="Recovering", generation=2, restarts=1, plan=record.plan)
    assert decide(spec, recovering, _observed(_nodes(0, 1, 2, 3), generation=1), now=NOW).plan is None


def test_a_failure_before_the_new_layout_has_a_step_restores_the_reshard_step_again():
    """Right after a grow, the new ranks hold nothing yet: instead of giving up, every rank restores the
    step the reshard restored, resharded again."""
    from lifeline.control import ContainerTerminated, classify, plan_recovery

    spec = _spec()
    big = spec.layout
    nodes = ("n0", "n2", "n1", "n3")
    state = JobState(layout=big, node_of_rank=nodes, cluster=ClusterState(_nodes(0, 1, 2, 3)), step=51,
                     generation=3, restarts=1, holdings=_memory((50, 51), ("n0", "n2")) | frozenset(), resharded_from=51)
    crash = classify([ContainerTerminated(0, "n0", "trainer", 2)], node_of_rank=nodes, hang_timeout_seconds=300)
    plan = plan_recovery(state, crash, spec, now=NOW)
    assert plan.action is RecoveryAction.ROLLBACK and plan.restore_step == 51 and plan.restore_ranks == (0, 1, 2, 3)
    assert plan.layout == big and "restore step 51 again" in plan.reason
    # without a reshard behind it, the same holdings cover no step: every rank starts over (docs/control.md)
    bare = JobState(layout=big, node_of_rank=nodes, cluster=ClusterState(_nodes(0, 1, 2, 3)), step=51,
                    generation=3, restarts=1, holdings=_memory((50, 51), ("n0", "n2")))
    over = plan_recovery(bare, crash, spec, now=NOW)
    assert (over.action, over.restore_step, over.sources) == (RecoveryAction.ROLLBACK, None, ())
