"""plan_recovery(): every rung of the recovery ladder, and the invariants every plan keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lifeline.api import LayoutSpec, RecoveryAction, load_trainingjob
from lifeline.control import (
    ClusterState,
    ContainerTerminated,
    Failure,
    FailureKind,
    Holding,
    JobState,
    NodeCondition,
    NodeState,
    RecoveryPlan,
    StepStalled,
    StoredWindows,
    UpstreamLog,
    stage_of,
    classify,
    place_replicas,
    plan_recovery,
)
from lifeline.errors import RecoveryError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
NOW = 1_000_000.0
LAYOUT = LayoutSpec(pipeline=2, data=2)  # ranks 0,1: stage 0; ranks 2,3: stage 1
NODE_OF_RANK = ("n0", "n1", "n2", "n3")


def _spec(**recovery):
    """The example's spec with spec.recovery fields replaced (wire names; None removes one)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    for key, value in recovery.items():
        body["spec"]["recovery"].pop(key, None)
        if value is not None:
            body["spec"]["recovery"][key] = value
    return load_trainingjob(body).spec


def _holdings(memory_steps=(40, 41), l2_steps=(30, 40), world=4, node_of_rank=NODE_OF_RANK, lost_l1=()):
    """L0 + L1 (Gemini placement, 1 peer) at memory_steps, L2 at l2_steps."""
    peers = place_replicas(node_of_rank[:world], 1)
    out = set()
    for step in memory_steps:
        for rank in range(world):
            out.add(Holding(step, rank, "L0", rank))
            if rank not in lost_l1:
                out.add(Holding(step, rank, "L1", peers[rank][0]))
    for step in l2_steps:
        out |= Holding.complete(step, world)
    return frozenset(out)


def _state(holdings=None, nodes=None, step=41, cool_downs=(), logs=(), restarts=0, layout=LAYOUT,
           node_of_rank=NODE_OF_RANK, stored=()):
    nodes = nodes or tuple(NodeState(n) for n in ("n0", "n1", "n2", "n3", "n4"))
    return JobState(
        layout=layout, node_of_rank=node_of_rank, cluster=ClusterState(nodes, cool_downs), step=step,
        generation=3, restarts=restarts, holdings=_holdings() if holdings is None else holdings,
        latest_complete_step=41, upstream_logs=logs, stored_windows=stored,
    )


def _lost(*nodes):
    state = _state()
    return classify([NodeCondition(n, ready=False) for n in nodes], node_of_rank=state.node_of_rank,
                    hang_timeout_seconds=300)


def test_trainer_crash_restarts_in_place_from_l0():
    holdings = _holdings() | {Holding(42, 0, "L0", 0), Holding(42, 1, "L0", 1)}  # step 42 is not complete
    failures = (Failure(FailureKind.TRAINER_CRASH, (2,), "n2", "exit 1"),)
    plan = plan_recovery(_state(holdings), failures, _spec(), now=NOW)
    assert plan.action is RecoveryAction.RESTART_IN_PLACE
    assert (plan.generation, plan.restarts, plan.restore_step) == (4, 1, 41)
    assert {s.tier for s in plan.sources} == {"L0"} and plan.source_of(2).node == "n2"
    assert plan.restart_ranks == (2,) and plan.create_pods == () and plan.cool_downs == ()
    assert plan.restore_ranks == (0, 1, 2, 3) and plan.node_of_rank == NODE_OF_RANK
    assert plan.farthest_tier == "L0"


def test_hang_restarts_every_trainer_in_place():
    (hang,) = classify([StepStalled(41, 900)], node_of_rank=NODE_OF_RANK, hang_timeout_seconds=300)
    plan = plan_recovery(_state(), [hang], _spec(), now=NOW)
    assert plan.action is RecoveryAction.RESTART_IN_PLACE and plan.restart_ranks == (0, 1, 2, 3)


def test_lost_node_replaces_its_pod_elsewhere_and_restores_from_l1():
    plan = plan_recovery(_state(), _lost("n3"), _spec(), now=NOW)
    assert plan.action is RecoveryAction.REPLACE_PODS
    assert plan.restore_step == 41
    lost = plan.source_of(3)
    assert (lost.tier, lost.holder, lost.node) == ("L1", 2, "n2")  # group placement: n2 <-> n3
    assert [plan.source_of(r).tier for r in (0, 1, 2)] == ["L0", "L0", "L0"]
    assert [(p.rank, p.node) for p in plan.create_pods] == [(3, "n4")]
    assert plan.node_of_rank == ("n0", "n1", "n2", "n4")
    assert plan.cool_downs == (("n3", NOW + 600),) and plan.avoid_nodes == {"n3"}
    assert plan.restart_ranks == () and plan.farthest_tier == "L1"


def test_cool_downs_expire_and_block_placement_until_then():
    nodes = tuple(NodeState(n) for n in ("n0", "n1", "n2", "n3", "n4", "n5"))
    cool = (("n4", NOW + 5), ("n5", NOW - 1))  # n4 still cooling, n5 expired
    plan = plan_recovery(_state(nodes=nodes, cool_downs=cool), _lost("n3"), _spec(), now=NOW)
    assert [(p.rank, p.node) for p in plan.create_pods] == [(3, "n5")]
    assert plan.cool_downs == (("n3", NOW + 600), ("n4", NOW + 5))


def test_losing_both_copies_rolls_back_every_rank_to_l2():
    plan = plan_recovery(_state(), _lost("n2", "n3"), _spec(), now=NOW)
    assert plan.action is RecoveryAction.ROLLBACK
    assert plan.restore_step == 40  # L2 at 40; survivors still hold 40 in L0
    assert [plan.source_of(r).tier for r in range(4)] == ["L0", "L0", "L2", "L2"]
    assert plan.restore_ranks == (0, 1, 2, 3)
    assert [(p.rank, p.node) for p in plan.create_pods] == [(2, "n4"), (3, "n0")]  # least loaded first


def test_one_failed_stage_replays_alone_when_its_upstream_logs_cover_the_gap():
    holdings = _holdings(memory_steps=(40, 41), l2_steps=(30,))
    logs = (UpstreamLog(rank=0, first_step=31, last_step=41), UpstreamLog(rank=1, first_step=31, last_step=41))
    plan = plan_recovery(_state(holdings, logs=logs), _lost("n2", "n3"), _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY
    assert (plan.restore_step, plan.replay_to_step) == (30, 41)
    assert plan.restore_ranks == (2, 3) and [s.rank for s in plan.sources] == [2, 3]
    # the same failure without coverage, or with replay off, rolls everyone back
    short = (UpstreamLog(rank=0, first_step=31, last_step=41), UpstreamLog(rank=1, first_step=35, last_step=41))
    assert plan_recovery(_state(holdings, logs=short), _lost("n2", "n3"), _spec(localizedReplay=True),
                         now=NOW).action is RecoveryAction.ROLLBACK
    assert plan_recovery(_state(holdings, logs=logs), _lost("n2", "n3"), _spec(), now=NOW).action is (
        RecoveryAction.ROLLBACK
    )
    # failures in two stages cannot replay locally
    two_stages = _lost("n1", "n3")
    assert plan_recovery(_state(_holdings(lost_l1=(1, 3), l2_steps=(30,)), logs=logs), two_stages,
                         _spec(localizedReplay=True), now=NOW).action is RecoveryAction.ROLLBACK


def test_a_crash_in_one_stage_restores_only_that_stage_and_a_failure_during_the_replay_goes_global():
    from dataclasses import replace

    from lifeline.control import ContainerTerminated

    holdings = _holdings(memory_steps=(36,), l2_steps=(32,))
    logs = tuple(UpstreamLog(r, 33, 41) for r in (0, 1))
    crash = classify([ContainerTerminated(3, "n3", "trainer", 137)], node_of_rank=NODE_OF_RANK,
                     hang_timeout_seconds=300)
    state = _state(holdings, logs=logs)
    plan = plan_recovery(state, crash, _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY
    assert (plan.restore_step, plan.replay_to_step) == (36, 41)
    assert plan.restore_ranks == (2, 3) and plan.restart_ranks == (3,)
    assert [(s.rank, s.tier) for s in plan.sources] == [(2, "L0"), (3, "L0")]
    # the neighbours' logs must reach back to the step after the copy
    late = tuple(UpstreamLog(r, 38, 41) for r in (0, 1))
    assert plan_recovery(replace(state, upstream_logs=late), crash, _spec(localizedReplay=True),
                         now=NOW).action is RecoveryAction.RESTART_IN_PLACE
    # a copy of the current step needs no log at all: the stage only restores
    now_held = _holdings(memory_steps=(41,), l2_steps=(32,))
    plan = plan_recovery(_state(now_held), crash, _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY and plan.restore_step == plan.replay_to_step == 41
    # a failure while a localized replay is under way falls back to a global rung
    busy = replace(state, interrupted=RecoveryAction.LOCALIZED_REPLAY)
    plan = plan_recovery(busy, crash, _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.RESTART_IN_PLACE and plan.restore_ranks == (0, 1, 2, 3)
    # a crash during a global recovery whose restore a rank of the other stage has not loaded yet
    # (its replacement still starting: fuzz seed 85756845) has no survivor state to keep: global too
    for unloaded in ((0,), (1,), (0, 1)):
        starting = replace(state, interrupted=RecoveryAction.ROLLBACK, unloaded=frozenset(unloaded))
        plan = plan_recovery(starting, crash, _spec(localizedReplay=True), now=NOW)
        assert plan.action is RecoveryAction.RESTART_IN_PLACE and plan.restore_ranks == (0, 1, 2, 3), unloaded
    # ... while the crashed stage's own unloaded ranks restore anyway: the replay stays local
    own = replace(state, interrupted=RecoveryAction.ROLLBACK, unloaded=frozenset({2}))
    assert plan_recovery(own, crash, _spec(localizedReplay=True), now=NOW).action is RecoveryAction.LOCALIZED_REPLAY


def test_with_sparse_checkpoints_a_failed_stage_restores_its_latest_complete_window():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"]["localizedReplay"] = True
    body["spec"]["checkpoint"]["sparse"] = {"window": 4}
    spec = load_trainingjob(body).spec
    holdings = _holdings(memory_steps=(30,), l2_steps=(20,))  # dense copies: step 30
    # every rank logged (and kept its slots) for steps 33..41: windows 32..35 (slot 32 gone), 36..39
    logs = tuple(UpstreamLog(r, 33, 41) for r in range(4))
    crash = classify([ContainerTerminated(3, "n3", "trainer", 137)], node_of_rank=NODE_OF_RANK,
                     hang_timeout_seconds=300)
    plan = plan_recovery(_state(holdings, logs=logs), crash, spec, now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY
    assert (plan.restore_step, plan.replay_to_step) == (36, 41) and plan.restore_ranks == (2, 3)
    assert "sparse window starting at 36" in plan.reason
    assert [(s.rank, s.tier) for s in plan.sources] == [(2, "L0"), (3, "L0")]
    # a node loss: the lost rank's slots come from its L1 peer
    plan = plan_recovery(_state(holdings, logs=logs), _lost("n3"), spec, now=NOW)
    assert plan.restore_step == 36 and [(s.rank, s.tier) for s in plan.sources] == [(2, "L0"), (3, "L1")]
    # no complete window held yet (the failed stage's slots start at 38): the dense copy at 30 is used
    young = tuple(UpstreamLog(r, 27 if r < 2 else 38, 41) for r in range(4))
    plan = plan_recovery(_state(holdings, logs=young), crash, spec, now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY and plan.restore_step == 30
    # a window still being captured (36..39 not finished at step 38) is not restorable
    early = tuple(UpstreamLog(r, 29, 38) for r in range(4))
    plan = plan_recovery(_state(holdings, logs=early, step=38), crash, spec, now=NOW)
    assert plan.restore_step == 32 and plan.replay_to_step == 38


def test_with_sparse_checkpoints_a_global_recovery_restores_every_rank_from_the_window():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["checkpoint"]["sparse"] = {"window": 4}
    spec = load_trainingjob(body).spec  # localized replay off: the ladder's global rungs
    holdings = _holdings(memory_steps=(30,), l2_steps=(20,))
    logs = tuple(UpstreamLog(r, 33, 41) for r in range(4))
    crash = classify([ContainerTerminated(3, "n3", "trainer", 137)], node_of_rank=NODE_OF_RANK,
                     hang_timeout_seconds=300)
    plan = plan_recovery(_state(holdings, logs=logs), crash, spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_ranks) == (RecoveryAction.RESTART_IN_PLACE, 36, (0, 1, 2, 3))
    assert "sparse-to-dense" in plan.reason
    plan = plan_recovery(_state(holdings, logs=logs), _lost("n3"), spec, now=NOW)
    assert plan.action is RecoveryAction.REPLACE_PODS and plan.restore_step == 36
    assert [s.tier for s in plan.sources] == ["L0", "L0", "L0", "L1"]
    # a dense copy newer than the window wins; without logs of every rank there is no window
    newer = _holdings(memory_steps=(40,), l2_steps=(20,))
    assert plan_recovery(_state(newer, logs=logs), crash, spec, now=NOW).restore_step == 40
    assert plan_recovery(_state(holdings, logs=logs[:3]), crash, spec, now=NOW).restore_step == 30


def test_sparse_windows_committed_to_l2_serve_when_memory_holds_nothing_newer():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["checkpoint"]["sparse"] = {"window": 4}
    spec = load_trainingjob(body).spec
    holdings = _holdings(memory_steps=(), l2_steps=(20,))  # memory lost; the dense L2 copy is of step 20
    stored = tuple(StoredWindows(r, (28, 32), 4) for r in range(4))
    lost = _lost("n0", "n1", "n2", "n3")
    plan = plan_recovery(_state(holdings, stored=stored), lost, spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_ranks) == (RecoveryAction.ROLLBACK, 32, (0, 1, 2, 3))
    assert {s.tier for s in plan.sources} == {"L2"} and "committed to L2" in plan.reason
    # a window must be committed by every rank, end by the current step and use the spec's W
    assert plan_recovery(_state(holdings, stored=stored[:3]), lost, spec, now=NOW).restore_step == 20
    assert plan_recovery(_state(holdings, stored=stored, step=34), lost, spec, now=NOW).restore_step == 28
    other_w = tuple(StoredWindows(r, (28, 32), 2) for r in range(4))
    assert plan_recovery(_state(holdings, stored=other_w), lost, spec, now=NOW).restore_step == 20
    # a newer dense copy or memory window wins
    assert plan_recovery(_state(_holdings(memory_steps=(), l2_steps=(40,)), stored=stored), lost, spec,
                         now=NOW).restore_step == 40
    # slots logged in memory (window 36) do not count when every holder of a lost rank's copies is lost
    logs = tuple(UpstreamLog(r, 29, 41) for r in range(4))
    plan = plan_recovery(_state(holdings, logs=logs, stored=stored), lost, spec, now=NOW)
    assert plan.restore_step == 32 and {s.tier for s in plan.sources} == {"L2"}
    plan = plan_recovery(_state(holdings, logs=logs, stored=stored), _lost("n3"), spec, now=NOW)
    assert plan.restore_step == 36 and [s.tier for s in plan.sources] == ["L0", "L0", "L0", "L1"]
    # a failed stage replays from its L2 window when its memory holds nothing newer
    body["spec"]["recovery"]["localizedReplay"] = True
    spec = load_trainingjob(body).spec
    logs = tuple(UpstreamLog(r, 33, 41) for r in range(4))
    crash = classify([ContainerTerminated(3, "n3", "trainer", 137)], node_of_rank=NODE_OF_RANK,
                     hang_timeout_seconds=300)
    young = tuple(UpstreamLog(r, 33 if r < 2 else 40, 41) for r in range(4))  # stage 1's memory slots: 40..
    plan = plan_recovery(_state(holdings, logs=young, stored=stored), crash, spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_ranks) == (RecoveryAction.LOCALIZED_REPLAY, 32, (2, 3))
    assert [s.tier for s in plan.sources] == ["L2", "L2"] and "sparse window starting at 32" in plan.reason


def test_starts_over_from_the_initial_state_without_any_verified_copy():
    plan = plan_recovery(_state(_holdings(l2_steps=())), _lost("n2", "n3"), _spec(), now=NOW)
    assert plan.action is RecoveryAction.ROLLBACK and plan.restore_step is None and plan.sources == ()
    assert plan.restore_ranks == (0, 1, 2, 3) and "start over from the initial state" in plan.reason
    assert plan.generation == 4 and plan.restarts == 1
    assert {p.rank for p in plan.create_pods} == {2, 3} and None not in {p.node for p in plan.create_pods}


def test_gives_up_after_max_restarts():
    plan = plan_recovery(_state(restarts=10), _lost("n3"), _spec(), now=NOW)
    assert plan.action is RecoveryAction.GIVE_UP
    assert "maxRestarts (10)" in plan.reason and plan.restarts == 10


def test_reshards_to_fewer_replica_groups_when_nodes_run_out():
    nodes = tuple(NodeState(n, capacity=1) for n in ("n0", "n1", "n2", "n3"))
    plan = plan_recovery(_state(nodes=nodes), _lost("n3"), _spec(), now=NOW)  # example: elastic minReplicas 2
    assert plan.action is RecoveryAction.RESHARD
    assert plan.layout == LayoutSpec(pipeline=2, data=1)
    assert plan.node_of_rank == ("n0", "n1") and plan.restore_ranks == (0, 1)
    # ranks 0 and 1 keep their pods and reshard the latest step the surviving sidecars hold in memory:
    # rank 3's own copy died with n3, its L1 replica (on n2, whose pod the new layout drops but which
    # serves until the new generation trains) did not
    assert plan.restore_step == 41 and [s.rank for s in plan.sources] == [0, 1, 2, 3]
    assert [(s.tier, s.holder) for s in plan.sources] == [("L0", 0), ("L0", 1), ("L0", 2), ("L1", 2)]
    assert "4 of 4 shards read from sidecar memory" in plan.reason
    assert plan.delete_ranks == (2, 3) and plan.create_pods == () and plan.restart_ranks == (0, 1)
    # with the replicas gone too, the shard of rank 3 comes from L2, and so does the step
    plan = plan_recovery(_state(_holdings(lost_l1=(3,)), nodes=nodes), _lost("n3"), _spec(), now=NOW)
    assert plan.restore_step == 40 and plan.source_of(3).tier == "L2" and plan.source_of(0).tier == "L0"


def test_without_elastic_unplaceable_pods_wait_for_room():
    nodes = tuple(NodeState(n, capacity=1) for n in ("n0", "n1", "n2", "n3"))
    spec = _spec(elastic=None)
    plan = plan_recovery(_state(nodes=nodes), _lost("n3"), spec, now=NOW)
    assert plan.action is RecoveryAction.REPLACE_PODS
    assert [(p.rank, p.node) for p in plan.create_pods] == [(3, None)]
    assert "wait for a node with room" in plan.reason


def test_elastic_floor_is_respected():
    nodes = tuple(NodeState(n, capacity=1) for n in ("n0", "n1", "n2", "n3"))
    spec = _spec(elastic={"minReplicas": 4})
    plan = plan_recovery(_state(nodes=nodes), _lost("n3"), spec, now=NOW)
    assert plan.action is RecoveryAction.REPLACE_PODS  # cannot shrink below 4: wait instead


def test_plans_are_deterministic_and_round_trip_through_json():
    a = plan_recovery(_state(), _lost("n3"), _spec(), now=NOW)
    b = plan_recovery(_state(), _lost("n3"), _spec(), now=NOW)
    assert a == b
    assert RecoveryPlan.from_json(a.to_json()) == a


def test_no_failures_is_an_error():
    with pytest.raises(RecoveryError, match="at least one failure"):
        plan_recovery(_state(), [], _spec(), now=NOW)
    with pytest.raises(RecoveryError, match=r"ranks \[4\] outside world size 4"):
        plan_recovery(_state(), [Failure(FailureKind.POD_LOST, (4,), "n0")], _spec(), now=NOW)


@settings(max_examples=150, deadline=None)
@given(
    lost_nodes=st.sets(st.sampled_from(NODE_OF_RANK), max_size=3),
    crashed=st.sets(st.integers(0, 3), max_size=4),
    l2=st.sets(st.sampled_from((20, 30, 40)), max_size=3),
    replay=st.booleans(),
)
def test_every_plan_reads_only_surviving_copies(lost_nodes, crashed, l2, replay):
    signals = [NodeCondition(n, ready=False) for n in lost_nodes]
    signals += [ContainerTerminated(r, NODE_OF_RANK[r], "trainer", 1) for r in crashed]
    failures = classify(signals, node_of_rank=NODE_OF_RANK, hang_timeout_seconds=300)
    if not failures:
        return
    state = _state(_holdings(l2_steps=tuple(l2)), logs=tuple(UpstreamLog(r, 0, 41) for r in range(4)))
    plan = plan_recovery(state, failures, _spec(localizedReplay=replay), now=NOW)
    assert plan.generation == state.generation + 1
    lost_ranks = {r for r, n in enumerate(NODE_OF_RANK) if n in lost_nodes}
    if plan.restore_step is None:  # no common copy: every rank starts over from the initial state
        assert plan.action is RecoveryAction.ROLLBACK and plan.sources == ()
        assert not l2 and ({"n0", "n1"} <= lost_nodes or {"n2", "n3"} <= lost_nodes)
        return
    assert plan.restore_step is not None and plan.restore_step <= state.step
    assert {s.rank for s in plan.sources} == set(plan.restore_ranks)
    for source in plan.sources:
        assert source.holder is None or source.holder not in lost_ranks
        assert (source.tier == "L2") == (source.node is None)
        assert Holding(plan.restore_step, source.rank, source.tier, source.holder) in state.holdings
    for pod in plan.create_pods:
        assert pod.rank in lost_ranks and pod.node not in lost_nodes and pod.node is not None
    assert {p.rank for p in plan.create_pods} == lost_ranks
    assert set(plan.avoid_nodes) == set(lost_nodes)
    if plan.action is RecoveryAction.LOCALIZED_REPLAY:  # one stage only; the others keep their state
        assert replay and len({stage_of(r, LAYOUT) for r in (*crashed, *lost_ranks)}) == 1
        assert set(plan.restore_ranks) == {r for r in range(4) if stage_of(r, LAYOUT) == stage_of(plan.restore_ranks[0], LAYOUT)}
    elif not lost_ranks:
        assert plan.action is RecoveryAction.RESTART_IN_PLACE and plan.restart_ranks == tuple(sorted(crashed))


def _sparse_spec(window: int):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"]["localizedReplay"] = True
    body["spec"]["checkpoint"]["sparse"] = {"window": window}
    return load_trainingjob(body).spec


def test_a_plan_names_the_copy_it_restores_a_dense_copy_at_a_window_start_is_not_a_window():
    """Issue 22 defect 1: a step that starts a window is restored from the window only when the plan
    chose the window; a dense copy of that step (newer than any complete window) is named as dense."""
    spec = _sparse_spec(4)
    crash = classify([ContainerTerminated(3, "n3", "trainer", 137)], node_of_rank=NODE_OF_RANK,
                     hang_timeout_seconds=300)
    logs = tuple(UpstreamLog(r, 33, 41) for r in range(4))  # complete windows 36..39 (32's slot 0 is gone)
    # a dense copy of step 40 (a window start whose slots 41..43 were never captured) beats window 36
    plan = plan_recovery(_state(_holdings(memory_steps=(40,), l2_steps=(20,)), logs=logs), crash, spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_window) == (RecoveryAction.LOCALIZED_REPLAY, 40, None)
    assert "restore step 40" in plan.reason and "window" not in plan.reason
    # the same with localized replay off: a global rung, still the dense copy
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["checkpoint"]["sparse"] = {"window": 4}
    plan = plan_recovery(_state(_holdings(memory_steps=(40,), l2_steps=(20,)), logs=logs), crash,
                         load_trainingjob(body).spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_window) == (RecoveryAction.RESTART_IN_PLACE, 40, None)
    # when the window is newer than every dense copy, the plan names the window and its length
    plan = plan_recovery(_state(_holdings(memory_steps=(30,), l2_steps=(20,)), logs=logs), crash, spec, now=NOW)
    assert (plan.restore_step, plan.restore_window) == (36, 4)
    plan = plan_recovery(_state(_holdings(memory_steps=(30,), l2_steps=(20,)), logs=logs), crash,
                         load_trainingjob(body).spec, now=NOW)
    assert (plan.action, plan.restore_step, plan.restore_window) == (RecoveryAction.RESTART_IN_PLACE, 36, 4)
    # the choice survives the catalog document
    assert RecoveryPlan.from_json(plan.to_json()).restore_window == 4


@pytest.mark.parametrize("failed_rank, named", [(0, "stage 1"), (2, "stages 0 and 2"), (4, "stage 1")])
def test_the_reason_of_a_localized_replay_names_only_the_neighbouring_stages_that_exist(failed_rank, named):
    """Issue 22 defect 3: a last-stage failure in a 3-stage job replays from stage 1's log alone."""
    layout = LayoutSpec(pipeline=3, data=2)
    nodes = tuple(f"n{r}" for r in range(6))
    holdings = _holdings(memory_steps=(36,), l2_steps=(32,), world=6, node_of_rank=nodes)
    logs = tuple(UpstreamLog(r, 33, 41) for r in range(6))
    crash = classify([ContainerTerminated(failed_rank, nodes[failed_rank], "trainer", 137)], node_of_rank=nodes,
                     hang_timeout_seconds=300)
    state = _state(holdings, logs=logs, layout=layout, node_of_rank=nodes, nodes=tuple(NodeState(n) for n in nodes))
    plan = plan_recovery(state, crash, _spec(localizedReplay=True), now=NOW)
    assert plan.action is RecoveryAction.LOCALIZED_REPLAY
    assert f"from the upstream logs of {named};" in plan.reason
    assert "stage -1" not in plan.reason and "stage 3" not in plan.reason
