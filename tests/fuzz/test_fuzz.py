"""The differential fuzzer in CI (issue 22): random jobs under random faults against failure-free runs.

Every commit runs :data:`CI_TRIALS` trials of ``lifeline bench fuzz`` whose seeds come from the commit
(``git rev-parse HEAD``; ``LIFELINE_FUZZ_SEED`` overrides it), so each commit meets new configurations
and fault schedules, one trial of the pipelining model (``--model pipelining-moe``), plus three of the
seeds that ever failed (tests/fuzz/regressions.py, :data:`REGRESSION_CASES`),
each its own test id. A trial checks what ``bench fuzz`` checks (:func:`lifeline.bench.fuzz.check`): the job finished
bit-identical to the failure-free run of its shape, the same loss at every step, the cheapest rung,
no second recovery without a second fault, the time lost per fault within its kind's bound. A failed
trial's message starts with the one command that replays it.

Budget: a trial is one ``lifeline run`` of 2..:data:`CI_MAX_WORLD` ranks (tens of seconds on two
cores) and the references are shared per shape: the commit's seeds start at a shape block
(:data:`lifeline.bench._fuzz_draw.SHAPE_BLOCK`), so the CI trials need two references.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from lifeline.bench._fuzz_draw import SHAPE_BLOCK
from lifeline.bench.fuzz import MODELS, References, commit_seed, run_one

from .regressions import REGRESSIONS

_ASKED = os.environ.get("LIFELINE_FUZZ_TRIALS")
CI_TRIALS = int(_ASKED) if _ASKED else 2
"""Trials of this commit: 2 by default (about 3 minutes with their reference), as many as
``LIFELINE_FUZZ_TRIALS`` says when set (8 is the issue's target, which the CI budget of issue 23 cannot
hold yet: the suite takes about an hour warm)."""
CI_REGRESSIONS = 3
"""Regression seeds replayed per commit by default: the newest, plus two drawn from the commit seed among
the other short ones (the nine of a CI run took 430 s; every fix is pinned by the unit test its entry
names, so a seed left out of one commit is still guarded, and the draw moves with every commit)."""
CI_MAX_WORLD = 4
"""CI draws layouts of at most 4 ranks (``bench fuzz`` defaults to 8) to fit its budget; the replay
command says ``--max-world 4``."""

CI_PIPELINING_MAX_WORLD = 3
"""The pipelining model's trial draws 2 or 3 stages (``--model pipelining-moe --max-world 3``)."""

CI_RUN_TIMEOUT = 420.0
"""A reference or trial run still going after this long fails (a wedged recovery must not eat the budget)."""

_BASE = commit_seed(Path(__file__).parent)
_BASE -= _BASE % SHAPE_BLOCK
COMMIT_SEEDS = [_BASE + i for i in range(CI_TRIALS)]


def _regression_cases(every: bool, seed: int) -> list:
    """Every regression seed when ``every`` (``LIFELINE_FUZZ_TRIALS`` set); else the newest short one plus
    ``CI_REGRESSIONS - 1`` drawn from the others with ``seed`` (the commit's; the long ones wait out
    ``startupGraceSeconds`` by design: ``Regression.long``)."""
    if every:
        return list(REGRESSIONS)
    short = [c for c in REGRESSIONS if not c.long]
    rest = random.Random(seed).sample(short[:-1], min(CI_REGRESSIONS - 1, len(short) - 1))
    return [c for c in short if c in rest] + short[-1:]


REGRESSION_CASES = _regression_cases(bool(_ASKED), _BASE)


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> References:
    """Failure-free references, one per shape, shared by the module's trials."""
    return References(tmp_path_factory.mktemp("fuzz-refs"), timeout=CI_RUN_TIMEOUT)


def _assert_passed(res: dict) -> None:
    if not res["reasons"]:
        return
    s = res.get("summary") or {}
    detail = {"config": res["config"], "recoveries": [
        {k: r.get(k) for k in ("action", "tier", "ranks", "from_step", "restore_step", "failures")}
        for r in s.get("recoveries", [])], "faults": [
        {k: f.get(k) for k in ("fault", "step", "note", "ineffective")} for f in s.get("faults", [])],
        "state_dir": res.get("state_dir")}
    pytest.fail(f"replay: {res['replay']}\n" + "\n".join(f"- {r}" for r in res["reasons"]) + "\n"
                + json.dumps(detail, indent=1, default=str)[:6000], pytrace=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed", COMMIT_SEEDS, ids=[f"seed-{s}" for s in COMMIT_SEEDS])
def test_trial_of_this_commit(seed, refs, tmp_path):
    _assert_passed(run_one(seed, root=tmp_path, refs=refs, max_world=CI_MAX_WORLD, timeout=CI_RUN_TIMEOUT))


@pytest.mark.slow
def test_pipelining_trial_of_this_commit(refs, tmp_path):
    """One trial of ``--model pipelining-moe`` (issue 25: the fuzzer covers a user's
    ``torch.distributed.pipelining`` model too), seeded from the commit like the others."""
    _assert_passed(run_one(_BASE, root=tmp_path, refs=refs, max_world=CI_PIPELINING_MAX_WORLD,
                           timeout=CI_RUN_TIMEOUT, model=MODELS[1]))


@pytest.mark.slow
@pytest.mark.parametrize("case", REGRESSION_CASES,
                         ids=[f"regression-seed-{c.seed}-w{c.max_world}"
                              + ("" if c.model == MODELS[0] else f"-{c.model}") for c in REGRESSION_CASES])
def test_regression_seed(case, refs, tmp_path):
    _assert_passed(run_one(case.seed, root=tmp_path, refs=refs, max_world=case.max_world, timeout=CI_RUN_TIMEOUT,
                           model=case.model, draws=case.draws))


def test_every_regression_seed_is_fixed_and_names_the_test_of_its_fix():
    """A seed stays open only while its bug is (CI then fails on it); every seed, replayed only on some
    commits, must name the test that pins its fix (``fixed="as S"``: the fix of seed S)."""
    by_seed = {c.seed: c for c in REGRESSIONS}
    for case in REGRESSIONS:
        assert case.fixed, f"regression seed {case.seed} is open: {case.found[:200]}"
        fix = by_seed[int(case.fixed.split()[1])].fixed if case.fixed.startswith("as ") else case.fixed
        assert "tests/" in fix, f"regression seed {case.seed} names no test of its fix"


def test_a_commit_replays_the_newest_regression_seed_and_two_drawn_ones():
    short = [c for c in REGRESSIONS if not c.long]
    drawn = {}
    for seed in range(_BASE, _BASE + 50):  # the draw moves with the commit seed
        cases = _regression_cases(False, seed)
        assert len(cases) == min(CI_REGRESSIONS, len(short)) and cases[-1] == short[-1]
        assert len({c.seed for c in cases}) == len(cases) and not any(c.long for c in cases)
        drawn.update((c.seed, c) for c in cases)
    assert len(drawn) == len(short)  # over commits, every short seed is replayed
    assert _regression_cases(True, _BASE) == REGRESSIONS
