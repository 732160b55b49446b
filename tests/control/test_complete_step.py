"""The latest complete step never moves backwards, on a real Redis, across a Redis restart.

A CI run of the chaos test ``trainer:rank=0:step=3, redis:step=5, flip:...`` saw the step go 4 -> 3:
Redis restarted empty, one sidecar re-filed its copies and asked for the newest step every rank held
while another rank's step-4 copy was not yet filed again, so step 3 was published after 4 had been.
"""

from __future__ import annotations

import pytest

from lifeline.catalog import Catalog
from lifeline.errors import CatalogError

WORLD = 4


def _file(catalog: Catalog, step: int, rank: int, tier: str = "L1") -> None:
    catalog.add_holding(step, rank, "L0", rank)
    if tier == "L1":
        catalog.add_holding(step, rank, "L1", (rank + 1) % WORLD)


def test_a_new_jobs_first_complete_step_is_set_by_the_last_rank_to_speak(catalog):
    for rank in range(WORLD):
        _file(catalog, 1, rank)
    answers = [catalog.try_advance(1, "L1", rank=rank) for rank in range(WORLD)]
    assert answers == [-1, -1, -1, 1] and catalog.latest_complete_step() == 1
    _file(catalog, 2, 0)
    assert catalog.try_advance(2, "L1", rank=0) == 1  # rank 0 alone holds step 2
    for rank in range(1, WORLD):
        _file(catalog, 2, rank)
    assert catalog.try_advance(2, "L1", rank=3) == 2 and catalog.latest_complete_step() == 2
    assert catalog.try_advance([1], "L1", rank=1) == 2  # never backwards


def test_after_a_redis_restart_a_stale_view_never_publishes_an_older_step(catalog):
    """The CI's order: rank 0 re-files steps 3 and 4 but rank 2's step-4 L1 copy is not filed yet,
    so the newest step every rank holds is 3; ranks 1-3 had seen 4 complete before the restart."""
    for rank in range(WORLD):
        _file(catalog, 3, rank)
        _file(catalog, 4, rank, tier="L1" if rank != 2 else "L0")
    assert catalog.try_advance([3, 4], "L1", rank=0, floor=3) == -1
    assert catalog.latest_complete_step() is None  # no step until every rank has spoken
    assert catalog.try_advance([3, 4], "L1", rank=1, floor=4) == -1
    assert catalog.try_advance([3, 4], "L1", rank=2, floor=4) == -1
    assert catalog.latest_complete_step() is None
    assert catalog.try_advance([3, 4], "L1", rank=3, floor=4) == 4
    assert catalog.latest_complete_step() == 4
    assert catalog.try_advance([3], "L1", rank=0, floor=3) == 4


def test_a_rank_that_speaks_again_replaces_its_own_record(catalog):
    for rank in range(WORLD - 1):
        _file(catalog, 5, rank)
        assert catalog.try_advance([5], "L1", rank=rank) == -1
    assert catalog.try_advance([5], "L1", rank=0) == -1  # rank 3 has not spoken: nothing set
    _file(catalog, 5, 3)
    assert catalog.try_advance([5], "L1", rank=3) == 5


def test_no_complete_step_while_every_rank_speaks_without_one(catalog):
    for rank in range(WORLD):
        assert catalog.try_advance([], "L1", rank=rank) == -1
    assert catalog.latest_complete_step() is None
    for rank in range(WORLD):
        _file(catalog, 7, rank)
    assert catalog.try_advance([7], "L1", rank=2) == 7  # every rank is on record (-1): the last filer sets it


def test_an_unknown_tier_is_refused(catalog):
    with pytest.raises(CatalogError, match="unknown tier 'L9'"):
        catalog.try_advance(1, "L9", rank=0)  # type: ignore[arg-type]
