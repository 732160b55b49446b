"""The catalog stays bounded: steps no copy is left of are forgotten past a horizon of recent steps
(their metadata, filed set and ``steps`` entry), on a real Redis; steps still held (an L2 checkpoint,
a memory copy) and the horizon's steps (verified replay reads their checksums) stay."""

from __future__ import annotations

import random

import pytest

from lifeline.catalog import Catalog


def _train(catalog: Catalog, steps: range, *, keep: int, persist_every: int) -> None:
    """What the sidecars file for ``steps`` checkpoints at every step: each rank's L0 copy with its
    metadata, released once ``keep`` newer ones exist; every ``persist_every``-th step also in L2."""
    for step in steps:
        for rank in range(catalog.world_size):
            catalog.add_holding(step, rank, "L0", rank, f'{{"step": {step}, "rank": {rank}}}')
            if step % persist_every == 0:
                catalog.add_holding(step, rank, "L2")
            if step - keep >= 0:
                assert catalog.release_holding(step - keep, rank, "L0", rank)


@pytest.mark.parametrize("seed", [3, 17])
def test_steps_no_copy_is_left_of_are_forgotten_past_the_horizon(catalog, redis_server, seed):
    rnd = random.Random(seed)
    keep, persist_every, horizon = rnd.choice([1, 2, 3]), rnd.choice([5, 10, 50]), rnd.choice([8, 20])
    _train(catalog, range(0, 120), keep=keep, persist_every=persist_every)
    before = len(catalog.steps())
    pruned = 0
    while (n := catalog.prune(horizon=horizon, batch=7)):  # a small batch: the cursor must go on
        pruned += n
    newest = 119
    kept = {s for s in range(120) if s >= newest - horizon or s % persist_every == 0}
    assert set(catalog.steps()) == kept and pruned == before - len(kept)
    for step in range(120):
        has_meta = catalog.meta(step, rnd.randrange(4)) is not None
        assert has_meta == (step in kept), step
    # nothing else of a forgotten step is left in Redis: only the held steps' and the horizon's keys
    keys = set(catalog._r.scan_iter(match=catalog.keys.prefix + "filed:*"))
    assert keys == {catalog.keys.filed(s) for s in kept}
    # a later prune with nothing new to examine forgets nothing; training on prunes the next steps
    assert catalog.prune(horizon=horizon) == 0
    _train(catalog, range(120, 140), keep=keep, persist_every=persist_every)
    while catalog.prune(horizon=horizon, batch=7):
        pass
    assert set(catalog.steps()) == {s for s in range(140) if s >= 139 - horizon or s % persist_every == 0}


def test_a_step_still_held_in_memory_past_the_horizon_keeps_its_metadata(catalog):
    """A spared or replicated copy keeps its step: it is examined once, found held and kept."""
    _train(catalog, range(0, 40), keep=2, persist_every=1000)
    catalog.add_holding(5, 2, "L1", 3, '{"step": 5}')  # a replica nobody released
    while catalog.prune(horizon=10):
        pass
    assert 5 in catalog.steps() and catalog.meta(5, 2) is not None
    assert 4 not in catalog.steps() and catalog.meta(4, 2) is None
