"""``lifeline bench crash`` with a handful of kills per target: zero torn checkpoints, the JSON shape, no leftovers."""

from __future__ import annotations

import pytest

import json

from ._cli import run_cli

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

ROW = {"trials", "killed_before_commit", "killed_after_commit", "committed_and_valid", "torn_visible",
       "committed_lost", "seconds", "problems"}


def test_bench_crash_few_trials_per_target_sees_nothing_torn(tmp_path):
    res = run_cli(["bench", "crash", "--trials", "6", "--seed", "7", "--state-dir", str(tmp_path / "state")],
                  cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not res.leftovers, f"processes left running: {res.leftovers}"
    out = json.loads(res.stdout)
    assert out["seed"] == 7 and {"python", "torch", "lifeline"} <= set(out["versions"])
    assert set(out["targets"]) == {"fs", "s3", "sidecar"}
    for name, row in out["targets"].items():
        assert ROW <= set(row), (name, sorted(row))
        assert row["trials"] == 6, (name, row)
        assert row["killed_before_commit"] + row["killed_after_commit"] == 6, (name, row)
        assert row["torn_visible"] == 0 and row["committed_lost"] == 0, (name, row["problems"])
        assert row["committed_and_valid"] >= 3, (name, row)  # at least the three timed saves before the kills
    assert out["totals"]["trials"] == 18 and out["totals"]["torn_visible"] == 0
