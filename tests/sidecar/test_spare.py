"""A step a plan reads from memory while the trainers save on (an elastic grow) is spared from eviction.

The race this closes (found by CI in ``test_launch_elastic``): the engine plans a grow at the latest
complete step s; before the trainers read the plan they save s+1 and s+2, and with ``keep: 2`` each
sidecar evicted s, so the grow read part of s from L2. Now the planner spares s atomically with the
check that every copy it names is still recorded, and a sidecar forgets its catalog entry (unless spared)
before it evicts: whichever of the two Redis runs first, the plan never names an evicted copy.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from lifeline.api import LayoutSpec, RecoveryAction, RecoveryPlan
from lifeline.api.recovery import RestoreSource
from lifeline.catalog import Catalog
from lifeline.errors import CatalogError
from lifeline.sidecar.store import Holding, Store

_jobs = itertools.count()


def _grow(step: int, holders: dict[int, int]) -> RecoveryPlan:
    """A grow to data degree 2 reading each rank's shard of ``step`` from the sidecar ``holders[rank]``."""
    return RecoveryPlan(
        action=RecoveryAction.RESHARD, generation=2, restarts=0, restore_step=step,
        layout=LayoutSpec(pipeline=2, data=2), node_of_rank=("n0", "n1", "n2", "n3"), restore_ranks=(0, 1, 2, 3),
        sources=tuple(RestoreSource(r, "L0" if h == r else "L1", h, f"n{h}") for r, h in sorted(holders.items())),
        restart_ranks=(), create_pods=(), delete_ranks=(), cool_downs=(), failures=(), reason="room came back")


@pytest.fixture
def catalog(redis_server):
    cat = Catalog(redis_server.url, f"spare-{next(_jobs)}", 2)
    try:
        yield cat
    finally:
        cat.close()


def _sidecar_store(catalog: Catalog, rank: int, evicted: list[Holding]) -> Store:
    """A Store wired as a sidecar's is (server.py): release asks the real catalog, eviction forgets the entry."""
    def release(h: Holding) -> bool:
        return catalog.release_holding(h.step, h.rank, h.tier, rank)

    def on_evict(h: Holding) -> None:
        evicted.append(h)
        catalog.remove_holding(h.step, h.rank, h.tier, rank)

    return Store(memory_bytes=1 << 20, on_evict=on_evict, release=release)


def _save(store: Store, catalog: Catalog, step: int, rank: int, keep: int = 2) -> None:
    catalog.add_holding(step, rank, "L0", rank, "{}")
    store.add(Holding("shard", step, rank, 10, memoryview(bytearray(10)), "{}", "L0", None), keep=keep)


def test_a_spared_step_outlives_keep_and_is_evicted_once_unspared(catalog):
    evicted: list[Holding] = []
    stores = {r: _sidecar_store(catalog, r, evicted) for r in (0, 1)}
    for step in (1, 2):
        for r, st in stores.items():
            _save(st, catalog, step, r)
            st.latest_complete = step
    assert catalog.spare(_grow(2, {0: 0, 1: 1}), ttl_seconds=60) and catalog.spared_step() == 2
    for step in (3, 4, 5):  # the trainers save on before they read the plan
        for r, st in stores.items():
            _save(st, catalog, step, r)
            st.latest_complete = step
    for r, st in stores.items():
        assert st.steps("shard", r) == [2, 4, 5]  # keep 2, plus the spared step
        assert {h.holder for h in catalog.holders(2, r)} == {r}  # and the catalog still records it
    assert sorted({h.step for h in evicted}) == [1, 3]
    catalog.unspare()
    for r, st in stores.items():
        _save(st, catalog, 6, r)
        st.latest_complete = 6
        assert st.steps("shard", r) == [5, 6] and not catalog.holders(2, r)


def test_a_spare_fails_when_a_copy_it_names_was_evicted_first(catalog):
    evicted: list[Holding] = []
    st = _sidecar_store(catalog, 0, evicted)
    for step in (1, 2, 3):
        _save(st, catalog, step, 0)
    catalog.add_holding(1, 1, "L0", 1, "{}")
    assert [h.step for h in evicted] == [1]  # keep 2: step 1 went (and left the catalog) before the spare
    assert not catalog.spare(_grow(1, {0: 0, 1: 1}), ttl_seconds=60)
    assert catalog.spared_step() is None  # nothing set: the engine plans again from what is recorded
    assert catalog.spare(_grow(2, {0: 0}), ttl_seconds=60)


def test_release_forgets_only_unspared_copies_and_a_spare_expires(catalog):
    catalog.add_holding(7, 0, "L1", 1)
    catalog.add_holding(8, 0, "L1", 1)
    assert catalog.spare(_grow(7, {0: 1}), ttl_seconds=0.2)
    assert not catalog.release_holding(7, 0, "L1", 1)
    assert {h.holder for h in catalog.holders(7, 0)} == {1}
    assert catalog.release_holding(8, 0, "L1", 1) and not catalog.holders(8, 0)
    ttl = catalog._r.pttl(catalog.keys.spared)
    assert 0 < ttl <= 200  # the spare lapses by itself (the grow's restore never ran): no step held forever


def test_a_plan_without_a_restore_step_has_nothing_to_spare(catalog):
    plan = _grow(3, {0: 0})
    plan = dataclasses.replace(plan, restore_step=None)
    assert not plan.reads_memory_while_training
    with pytest.raises(CatalogError, match="restore step"):
        catalog.spare(plan, ttl_seconds=1)


def test_only_a_plan_answering_no_failure_from_memory_needs_a_spare():
    assert _grow(3, {0: 0, 1: 1}).reads_memory_while_training
    from_l2 = _grow(3, {0: 0})
    from_l2 = dataclasses.replace(from_l2, sources=(RestoreSource(0, "L2", None, None),))
    assert not from_l2.reads_memory_while_training


def test_lifeline_run_spares_the_step_of_a_recovery_plan_that_reads_memory(catalog):
    """Fuzz seed 3085 (``keep`` 1): a ``RestartInPlace`` named rank 2's L0 copy of step 10, and the
    sidecar evicted it for step 11's save, sealed after the plan's catalog view (the restore: ``no
    verified copy of step 10 rank 2``). ``lifeline run`` now spares the step of every plan that reads
    memory, not only a grow's, so the sidecar keeps it until training resumed."""
    from types import SimpleNamespace

    from lifeline.api import Failure, FailureKind
    from lifeline.launch._apply import _Applying

    evicted: list[Holding] = []
    stores = {r: _sidecar_store(catalog, r, evicted) for r in (0, 1)}
    for r, st in stores.items():
        _save(st, catalog, 10, r, keep=1)
        st.latest_complete = 10
    hang = (Failure(FailureKind.HANG, (1,), None, "no progress"),)
    plan = dataclasses.replace(_grow(10, {0: 0, 1: 1}), action=RecoveryAction.RESTART_IN_PLACE, failures=hang,
                               layout=LayoutSpec(data=2), node_of_rank=("n0", "n1"), restore_ranks=(0, 1))
    assert plan.reads_memory and not plan.reads_memory_while_training
    events: list[str] = []
    runner = SimpleNamespace(catalog=catalog, _spare_held=False, _event=events.append,
                             job=SimpleNamespace(spec=SimpleNamespace(recovery=SimpleNamespace(startup_grace_seconds=60))))
    assert _Applying._spared(runner, plan) and runner._spare_held and catalog.spared_step() == 10
    for r, st in stores.items():  # the save of step 11 lands after the plan: keep 1 no longer evicts 10
        _save(st, catalog, 11, r, keep=1)
        assert st.steps("shard", r) == [10, 11] and {h.holder for h in catalog.holders(10, r)} == {r}
    assert not evicted and not events
