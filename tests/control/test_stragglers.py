"""Straggler detection (issue 27): the pure rule, the spec, the ``slow`` fault's parsing and environment.

Samples are drawn from a seeded RNG (``LIFELINE_STRAGGLER_TEST_SEED``, default 11): healthy ranks'
compute times are ``base × lognormal(0, 0.15)`` with a few 3× spikes (a loaded 2-core machine's
noise, docs/stragglers.md "Measured"); a slow rank's are twice that.
"""

from __future__ import annotations

import os
import random

import pytest

from lifeline.api import load_trainingjob
from lifeline.api import LayoutSpec, StragglerSpec
from lifeline.control.stragglers import HISTORY_WINDOWS, StragglerWatch, detect_stragglers, samples_of
from lifeline.errors import ConfigError
from lifeline.launch import _slow as launch_slow
from lifeline.launch.inject import SLOW_FACTOR, parse_injection
from lifeline.runtime import _stragglers as runtime_stragglers

SEED = int(os.environ.get("LIFELINE_STRAGGLER_TEST_SEED", "11"))


def _samples(rng: random.Random, world: int, steps: int, *, slow: dict[int, float] | None = None,
             spikes: float = 0.05) -> dict[int, dict[int, float]]:
    base = rng.uniform(0.01, 0.05)
    out: dict[int, dict[int, float]] = {}
    for rank in range(world):
        factor = (slow or {}).get(rank, 1.0)
        out[rank] = {s: base * factor * rng.lognormvariate(0.0, 0.15) * (3.0 if rng.random() < spikes else 1.0)
                     for s in range(1, steps + 1)}
    return out


@pytest.mark.parametrize("world", [2, 3, 8])
def test_a_2x_rank_is_flagged_and_noise_flags_nobody(world):
    rng = random.Random(SEED * 100 + world)
    for _ in range(50):
        healthy = detect_stragglers(_samples(rng, world, 30), threshold=1.5, window=10)
        assert healthy.steps == tuple(range(21, 31)) and healthy.stragglers == (), healthy
        slow = rng.randrange(world)
        verdict = detect_stragglers(_samples(rng, world, 30, slow={slow: 2.0}), threshold=1.5, window=10)
        assert verdict.stragglers == (slow,), verdict
        score = {s.rank: s for s in verdict.scores}[slow]
        assert 1.5 < score.relative < 3.0, score


def test_one_slow_step_flags_nobody_and_a_threshold_above_the_slowdown_flags_nobody():
    samples = {r: {s: 0.02 for s in range(1, 11)} for r in range(4)}
    samples[2][7] = 0.2  # one step 10x: the window's median ignores it
    assert detect_stragglers(samples, threshold=1.5, window=10).stragglers == ()
    for s in range(1, 11):
        samples[3][s] = 0.05  # 2.5x on every step
    assert detect_stragglers(samples, threshold=1.5, window=10).stragglers == (3,)
    assert detect_stragglers(samples, threshold=3.0, window=10).stragglers == ()


def test_only_common_steps_are_judged_and_the_individual_score_compares_with_the_best():
    samples = {0: {s: 0.01 for s in range(1, 21)}, 1: {s: 0.01 if s <= 10 else 0.03 for s in range(1, 21)}}
    verdict = detect_stragglers(samples, threshold=1.5, window=5)
    assert verdict.steps == (16, 17, 18, 19, 20) and verdict.stragglers == (1,)
    scores = {s.rank: s for s in verdict.scores}
    assert scores[1].relative == pytest.approx(3.0) and scores[1].individual == pytest.approx(3.0)
    assert scores[0].individual == pytest.approx(1.0)
    samples[0] = {s: 0.01 for s in range(1, 18)}  # rank 0 reported up to step 17 only
    assert detect_stragglers(samples, threshold=1.5, window=5).steps == (13, 14, 15, 16, 17)
    assert detect_stragglers(samples, threshold=1.5, window=30).steps == ()  # too few steps: no verdict
    assert detect_stragglers({0: samples[0]}, threshold=1.5, window=5).scores == ()  # one rank: no verdict


@pytest.mark.parametrize("threshold,window", [(1.0, 10), (0.5, 10), (1.5, 0)])
def test_detection_rejects_a_threshold_not_above_1_and_an_empty_window(threshold, window):
    with pytest.raises(ConfigError):
        detect_stragglers({0: {1: 1.0}, 1: {1: 1.0}}, threshold=threshold, window=window)


def _job(straggler: dict | None) -> dict:
    recovery = {} if straggler is None else {"straggler": straggler}
    return {"apiVersion": "lifeline.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "s"},
            "spec": {"replicas": 2, "layout": {"data": 2}, "steps": 10, "recovery": recovery,
                     "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}}}}


def test_the_spec_defaults_and_validates():
    spec = load_trainingjob(_job(None)).spec.recovery.straggler
    assert (spec.threshold, spec.window, spec.action) == (1.5, 10, "report")
    spec = load_trainingjob(_job({"threshold": 2, "window": 5, "action": "replace"})).spec.recovery.straggler
    assert (spec.threshold, spec.window, spec.action) == (2.0, 5, "replace")
    assert spec.to_wire() == {"threshold": 2.0, "window": 5, "action": "replace"}
    for bad in ({"threshold": 1}, {"window": 0}, {"action": "kill"}):
        with pytest.raises(ConfigError):
            load_trainingjob(_job(bad))


def test_slow_parses_and_reaches_its_rank_on_its_first_node_only():
    inj = parse_injection("slow:rank=1:step=5", world_size=2, steps=20)
    assert (inj.kind, inj.rank, inj.step, inj.slow_factor, inj.holds) == ("slow", 1, 5, SLOW_FACTOR, False)
    fast = parse_injection("slow:step=5:rank=0:factor=3", world_size=2, steps=20)
    assert str(fast) == "slow:rank=0:step=5:factor=3" and parse_injection(str(fast), world_size=2, steps=20) == fast
    for text in ("slow:step=5", "slow:rank=1:step=5:factor=1", "slow:rank=1:step=5:factor=x",
                 "slow:rank=1:step=5:when=recovery", "nan:rank=1:step=5:factor=2", "slow:rank=1:step=20"):
        with pytest.raises(ConfigError):
            parse_injection(text, world_size=2, steps=20)
    env = launch_slow.slow_env([inj], 1, "node-1")
    assert env == {runtime_stragglers.SLOW_ENV: "5:2"} and launch_slow.slow_env([inj], 1, "node-2") == {}
    assert launch_slow.slow_env([inj], 0, "node-0") == {}
    assert runtime_stragglers.StepTimes.from_env(env).slow == (5, 2.0)
    assert runtime_stragglers.StepTimes.from_env({}).slow is None
    with pytest.raises(ValueError):
        runtime_stragglers.parse_slow("0:2")


class _Result:
    def __init__(self, step: int, seconds: float, wait_seconds: float) -> None:
        self.step, self.seconds, self.wait_seconds = step, seconds, wait_seconds


def test_step_times_report_compute_and_the_slow_fault_sleeps_its_share(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(runtime_stragglers.time, "sleep", slept.append)
    times = runtime_stragglers.StepTimes((3, 2.0))
    assert times.after_step(object()) == {} and times.fields() == {}
    times.before_step(2)
    assert times.after_step(_Result(2, 0.05, 0.02)) == {"wait_seconds": 0.02, "compute_seconds": 0.03}
    assert slept == []
    # from step 3: before it, (2 - 1) x the compute before the fault (step 2's 0.03 s), whatever this step's own
    times.before_step(3)
    assert slept == [pytest.approx(0.03)]
    assert times.after_step(_Result(3, 0.02, 0.01)) == {"wait_seconds": 0.01, "slow_seconds": 0.03,
                                                        "compute_seconds": 0.04}
    assert times.fields() == {"timings": {"3": 0.04}}  # the process's first step (2) is no sample
    late = runtime_stragglers.StepTimes((3, 3.0))  # started after its fault's step: its first step is the reference
    late.before_step(5)
    assert "slow_seconds" not in late.after_step(_Result(5, 0.05, 0.01))
    late.before_step(6)
    assert late.after_step(_Result(6, 0.03, 0.01))["slow_seconds"] == pytest.approx(0.08)
    for step in range(4, 4 + runtime_stragglers.KEEP):
        times.before_step(step)
        times.after_step(_Result(step, 0.02, 0.0))
    timings = times.fields()["timings"]
    assert len(timings) == runtime_stragglers.KEEP and min(map(int, timings)) == 4
    times.before_step(6)
    times.after_step(_Result(6, 0.02, 0.0))  # a re-run after a rollback: the newer steps are gone
    assert max(map(int, times.fields()["timings"])) == 6


def test_ranks_are_compared_within_their_pipeline_stage_and_samples_come_from_report_timings():
    # stage 1 (ranks 2, 3) computes 2x stage 0 (ranks 0, 1) by design; rank 3 is 2x its stage peer
    samples = {0: {s: 0.01 for s in range(1, 6)}, 1: {s: 0.01 for s in range(1, 6)},
               2: {s: 0.02 for s in range(1, 6)}, 3: {s: 0.04 for s in range(1, 6)}}
    stages = {0: 0, 1: 0, 2: 1, 3: 1}
    assert detect_stragglers(samples, threshold=1.5, window=5, group_of=stages).stragglers == (3,)
    assert detect_stragglers(samples, threshold=1.5, window=5).stragglers == (2, 3)  # stages mixed: 2 is wrongly slow
    alone = {0: 0, 1: 0, 2: 1, 3: 2}  # a rank alone in its stage is compared with every other rank
    assert detect_stragglers(samples, threshold=1.5, window=5, group_of=alone).stragglers == (2, 3)

    class Report:
        def __init__(self, rank, generation, timings):
            self.rank, self.generation, self.timings = rank, generation, timings

        def get(self, name, default=None):
            return self.timings if name == "timings" else default

    reports = [Report(0, 1, {"4": 0.5, "5": "x"}), Report(1, 0, {"4": 0.1}), Report(2, 1, None), Report(5, 1, {"1": 1})]
    assert samples_of(reports, 1, 4) == {0: {4: 0.5}}


class _Report:
    """A progress report as :func:`samples_of` reads it (``lifeline.catalog.ProgressReport``'s surface)."""

    def __init__(self, rank, generation, timings):
        self.rank, self.generation, self.timings = rank, generation, timings

    def get(self, name, default=None):
        return self.timings if name == "timings" else default


class _View:
    def __init__(self, generation, reports):
        self.generation, self.reports = generation, {r.rank: r for r in reports}


def _round(generation, first, last, slow=None, world=4):
    """A catalog read whose reports carry steps ``first..last``: 10 ms each, ``slow`` rank 20 ms."""
    return _View(generation, [_Report(r, generation, {str(s): 0.02 if r == slow else 0.01
                                                       for s in range(first, last + 1)}) for r in range(world)])


def test_the_watch_merges_rounds_flags_a_rank_once_per_generation_and_starts_afresh_in_a_new_one():
    watch = StragglerWatch(StragglerSpec(threshold=1.5, window=3))
    assert watch.observe(_round(1, 1, 2, slow=3), 4) is None  # 2 steps < window: no verdict yet
    verdict = watch.observe(_round(1, 3, 3, slow=3), 4)  # the reports bring step 3 only: merged with 1-2
    assert verdict is not None and verdict.steps == (1, 2, 3) and verdict.stragglers == (3,)
    assert [s.rank for s in watch.flag(verdict)] == [3] and set(watch.flagged) == {3}
    assert watch.flagged[3].relative == pytest.approx(2.0)
    assert watch.observe(_round(1, 3, 3, slow=3), 4) is None  # nothing newer to judge
    verdict = watch.observe(_round(1, 4, 4, slow=3), 4)
    assert verdict.stragglers == (3,) and watch.flag(verdict) == []  # flagged once per generation
    for step in range(5, 5 + HISTORY_WINDOWS * 3 + 2):  # samples kept: HISTORY_WINDOWS windows per rank
        watch.observe(_round(1, step, step, slow=3), 4)
    assert len(watch.samples[0]) == HISTORY_WINDOWS * 3
    assert watch.observe(_round(2, 1, 2, slow=1), 4) is None and watch.samples[0] == {1: 0.01, 2: 0.01}
    assert watch.flagged == {} and watch.generation == 2  # a new generation: judged afresh
    verdict = watch.observe(_round(2, 3, 3, slow=1), 4)
    assert [s.rank for s in watch.flag(verdict)] == [1]


def test_the_watch_compares_ranks_within_their_pipeline_stage_when_it_knows_the_layout():
    watch = StragglerWatch(StragglerSpec(threshold=1.5, window=2))
    view = _View(0, [_Report(r, 0, {"1": t, "2": t}) for r, t in enumerate((0.01, 0.01, 0.02, 0.02))])
    assert watch.observe(view, 4).stragglers == (2, 3)  # no layout: stage 1's more work looks slow
    watch = StragglerWatch(StragglerSpec(threshold=1.5, window=2))
    watch.layout = LayoutSpec(pipeline=2, data=2)
    assert watch.group_of(4) == {0: 0, 1: 0, 2: 1, 3: 1}
    assert watch.observe(view, 4).stragglers == ()
