"""Copies that died with a failure are never named by a later plan: publishing a plan forgets, in
the real Redis catalog, the memory copies held by the ranks whose memory it declares lost, before a
replacement sidecar registers (fuzz seed 193682496: a second failure planned while the replaced
sidecar was still starting restored a step from a copy that had died with the first)."""

from __future__ import annotations

import uuid

import pytest

from lifeline.api import LayoutSpec, RecoveryAction
from lifeline.catalog import Catalog
from lifeline.control import (
    ClusterState,
    Failure,
    FailureKind,
    Holding,
    JobState,
    NodeState,
    place_replicas,
    plan_recovery,
)

from tests.control.test_control_plan import NOW, _spec

LAYOUT = LayoutSpec(pipeline=2, data=2)
NODES = ("n0", "n1", "n2", "n3")


def _seed(catalog: Catalog) -> None:
    """L0 and L1 (Gemini placement, n0<->n1, n2<->n3) at steps 40 and 41; L2 at 40."""
    peers = place_replicas(NODES, 1)
    for step in (40, 41):
        for rank in range(4):
            catalog.add_holding(step, rank, "L0", rank)
            catalog.add_holding(step, rank, "L1", peers[rank][0])
    for rank in range(4):
        catalog.add_holding(40, rank, "L2")


def _plan(catalog: Catalog, node_of_rank: tuple[str, ...], lost_node: str, generation: int):
    state = JobState(
        layout=LAYOUT, node_of_rank=node_of_rank,
        cluster=ClusterState(tuple(NodeState(n, ready=n != lost_node) for n in (*NODES, "n4", "n5")), ()),
        step=41, generation=generation, restarts=generation, holdings=catalog.holdings_at([40, 41]),
        latest_complete_step=41, upstream_logs=(), stored_windows=(),
    )
    rank = node_of_rank.index(lost_node)
    failure = Failure(FailureKind.NODE_LOST, (rank,), lost_node, "Ready=False")
    return plan_recovery(state, [failure], _spec(), now=NOW)


@pytest.mark.parametrize("lost_first, lost_second", [("n3", "n2"), ("n0", "n1"), ("n1", "n0")])
def test_a_second_failure_never_restores_a_copy_that_died_with_the_first(catalog, lost_first, lost_second):
    _seed(catalog)
    first = _plan(catalog, NODES, lost_first, 0)
    dead = NODES.index(lost_first)
    assert first.action is RecoveryAction.REPLACE_PODS and first.memory_lost_ranks == (dead,)
    assert catalog.put_plan(first) == 4  # L0@dead at 40, 41 and the L1 copy it held at 40, 41
    holdings = catalog.holdings_at([40, 41])
    assert not any(h.holder == dead for h in holdings)
    assert {h for h in holdings if h.tier == "L2"} == Holding.complete(40, 4)

    # the second failure comes before the replaced sidecar registers anything: the peer of the
    # newly lost rank held its L1 copy in memory that died, so only L2 covers it
    moved = tuple(p.node for p in sorted(first.create_pods))[0]
    now_at = tuple(moved if r == dead else n for r, n in enumerate(NODES))
    second = _plan(catalog, now_at, lost_second, 1)
    assert second.action is RecoveryAction.ROLLBACK and second.restore_step == 40
    assert all(s.holder != dead for s in second.sources)
    assert second.source_of(NODES.index(lost_second)).tier == "L2"


def test_storing_a_plan_again_keeps_what_the_replaced_sidecar_registered_since(catalog):
    _seed(catalog)
    first = _plan(catalog, NODES, "n3", 0)
    assert catalog.put_plan(first) == 4
    catalog.add_holding(41, 3, "L0", 3)  # the replacement restored step 41 and registered it
    assert catalog.put_plan(first) == 0  # a Redis restart or a retried write: same generation
    assert Holding(41, 3, "L0", 3) in catalog.holders(41, 3)
    assert catalog.generation() == first.generation and catalog.plan(first.generation) == first


def test_a_plan_answering_no_failure_forgets_nothing(catalog):
    _seed(catalog)
    start = _plan(catalog, NODES, "n3", 0)
    grow = type(start)(**{**start.__dict__, "failures": ()})
    assert grow.memory_lost_ranks == () and catalog.put_plan(grow) == 0
    assert len(catalog.holdings_at([40, 41])) == 4 * 2 * 2 + 4


def test_each_sidecar_s_copies_are_indexed_and_the_index_follows_every_write(catalog):
    """``held:<h>`` lists exactly what the holders sets say rank h's sidecar holds, after adds,
    releases, a removal and a stale incarnation dropped."""
    _seed(catalog)
    peers = place_replicas(NODES, 1)
    owner = peers[1][0]  # the rank whose sidecar holds rank 1's L1 copies

    def from_sets(h: int) -> set:
        return {(x.step, x.rank, x.tier) for x in catalog.holdings_at(catalog.steps()) if x.holder == h}

    for h in range(4):
        assert set(catalog.held_by(h)) == from_sets(h) == {(s, r, t) for s in (40, 41) for r, t in
                                                            ((h, "L0"), (_l1_of(peers, h), "L1"))}
    assert catalog.release_holding(40, 1, "L1", owner)
    catalog.remove_holding(41, 2, "L0", 2)
    catalog.add_holding(42, 0, "L0", 0, "{}")
    assert catalog.release_holding(42, 0, "L0", 0)
    for h in range(4):
        assert set(catalog.held_by(h)) == from_sets(h)
    assert (40, 1, "L1") not in catalog.held_by(owner) and (41, 2, "L0") not in catalog.held_by(2)
    assert not any(s == 42 for s, _, _ in catalog.held_by(0))

    # a restarted sidecar of rank 0 holds only its own step 41: (40, 0, L0) and (41, 1, L1) died with its
    # earlier self ((40, 1, L1) was released above)
    assert owner == 0 and catalog.drop_stale(0, [(41, 0, "L0")]) == 2
    assert catalog.held_by(0) == [(41, 0, "L0")] == sorted(from_sets(0))


def test_a_lost_rank_s_copies_are_forgotten_at_the_cost_of_what_it_held(catalog, redis_server):
    """A plan for a lost rank among 1,000 at 64 steps reads that rank's index, not 64 x 1,000 keys:
    Redis counts the commands the script ran (INFO commandstats), which must stay near the copies held."""
    import redis

    big = Catalog(redis_server.url, f"big-{uuid.uuid4().hex[:6]}", 1000)
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        p = big._r.pipeline(transaction=False)
        for step in range(64):  # rank 3's sidecar holds its own L0 copy and rank 4's L1 copy
            for rank, tier in ((3, "L0"), (4, "L1")):
                p.sadd(big.keys.holders(step, rank), f"{tier}@3")
                p.zadd(big.keys.held(3), {f"{step}:{rank}:{tier}": step})
            p.zadd(big.keys.steps, {str(step): step})
        p.execute()
        plan = _plan(catalog, NODES, "n3", 0)
        assert plan.memory_lost_ranks == (3,)
        before = _srem_calls(admin)
        assert big.put_plan(plan) == 128
        assert _srem_calls(admin) - before == 128  # one per copy rank 7 held, none for the other ranks
        assert big.held_by(3) == [] and not big.holdings_at(range(64))
    finally:
        big.wipe()
        big.close()
        admin.close()


def _l1_of(peers, holder: int) -> int:
    """The rank whose L1 copies ``holder`` keeps (the Gemini placement pairs the nodes)."""
    return next(r for r, ps in peers.items() if ps[0] == holder)


def _srem_calls(admin) -> int:
    return int(admin.info("commandstats").get("cmdstat_srem", {}).get("calls", 0))
