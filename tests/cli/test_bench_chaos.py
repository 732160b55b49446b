"""``lifeline bench chaos`` end to end: a seeded trial with two faults passes and the JSON reports it."""

from __future__ import annotations

import pytest

import json

from lifeline.bench._chaos_schedule import schedule

from ._cli import run_cli

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

WORLD, STEPS = 2, 12


def test_bench_chaos_seeded_trials_pass_and_report(tmp_path):
    seed = next(i for i in range(100) if len(schedule(i, world_size=WORLD, steps=STEPS, persist_every=4).injections) > 1)
    res = run_cli(["bench", "chaos", "--trials", "1", "--seed", str(seed), "--state-dir", str(tmp_path / "b")],
                  cwd=tmp_path, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not res.leftovers, f"processes left running: {res.leftovers}"
    out = json.loads(res.stdout)
    assert out["failed"] == [] and out["passed"] == 1, out["failed"]
    assert sum(out["faults_fired"].values()) >= 2 and out["faults_not_fired"] == {}
    assert out["checks"]["torn"] == 0 and out["checks"]["complete_step_regressions"] == 0
    assert set(out["time_lost_seconds"]) <= set(out["faults_fired"]) | {f"{k}+recovery" for k in out["faults_fired"]}
