"""The step the engine plans from is the step the ranks' states are at (fuzz regression seed 9)."""

from __future__ import annotations

from lifeline.catalog import ProgressReport
from lifeline.control import Progress


def _report(event: str, rank: int, generation: int, step: int) -> ProgressReport:
    return ProgressReport(event, "j", rank, generation, 1000.0 + rank, step, {})


def test_a_rank_the_current_plan_restores_is_at_its_restore_step_until_it_reports_again():
    # generation 1 rolls every rank back from step 6 to step 4; rank 0's replacement fails its load (a
    # flipped L2 copy) before it reports anything, so its latest report is its lost pod's step 6
    reports = [_report("step", 0, 0, 6), _report("restore", 1, 1, 4), _report("restore", 2, 1, 4)]
    p = Progress.of(reports, 1)
    assert p.step == 6  # the highest step reported, as before
    assert p.state_step(1, {0: 4, 1: 4, 2: 4}) == 4
    assert p.state_step(1, {0: 0, 1: 0, 2: 0}) == 4  # (a rollback to the initial state: rank 0 at 0)
    # a rank that trained on in the plan's generation is at the step it reported
    assert Progress.of([*reports[1:], _report("step", 0, 1, 5)], 1).state_step(1, {0: 4, 1: 4, 2: 4}) == 5


def test_a_survivor_the_plan_does_not_restore_keeps_its_step():
    # a LocalizedReplay restores stage 0 (rank 0) from step 3; rank 1 of another stage keeps step 6
    reports = [_report("plan", 0, 1, 6), _report("plan", 1, 1, 6)]
    assert Progress.of(reports, 2).state_step(2, {0: 3}) == 6
    assert Progress.of([], 2).state_step(2, {0: 3}) == 0


def test_ranks_that_loaded_the_current_generation_s_state():
    """A replacement that has not reported since its pod started (its latest report is its lost pod's,
    of an older generation) or that only read the plan has loaded nothing (fuzz seed 85756845)."""
    reports = [_report("step", 0, 0, 4), _report("restore", 1, 1, 3), _report("plan", 2, 1, 4),
               _report("keep", 3, 1, 4)]
    assert Progress.of(reports, 1).loaded_in(1) == {1, 3}
    assert Progress.of([*reports, _report("step", 0, 1, 4)], 1).loaded_in(1) == {0, 1, 3}
    assert Progress.of(reports, 2).loaded_in(2) == frozenset()
