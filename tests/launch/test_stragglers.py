"""Stragglers (issue 27), end to end: a rank slowed to 2x is flagged and, with ``action: replace``, moved.

2 data-parallel ranks, GPT-MoE, 30 steps. The slow rank and the step it slows down at are drawn from a
seeded RNG (``LIFELINE_STRAGGLER_TEST_SEED``, default 11). The failure-free reference run (same spec,
``action: report``) must flag nobody: the noise of the loaded test machine (docs/stragglers.md,
"Measured") stays under the threshold over a 10-step window.
"""

from __future__ import annotations

import os
import random

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

WORLD = 2
STEPS = 30
WINDOW = 10
THRESHOLD = 1.5
SEED = int(os.environ.get("LIFELINE_STRAGGLER_TEST_SEED", "11"))
QUIET = ("--spares-per-node", "0")  # no spares warming on the shared cores meanwhile (time and noise)


def _doc(name: str, action: str) -> dict:
    doc = job_doc(name, pipeline=1, data=WORLD, steps=STEPS)
    doc["spec"]["checkpoint"].update(every=1, persist={"every": STEPS, "uri": "file:///unused"})
    doc["spec"]["recovery"]["straggler"] = {"threshold": THRESHOLD, "window": WINDOW, "action": action}
    return doc


def test_a_rank_slowed_to_2x_is_flagged_within_20_steps_and_moved_bit_identically(tmp_path):
    ref = lifeline_run(write_job(tmp_path / "ref.yaml", _doc("ref", "report")), tmp_path / "ref",
                       "--persist-uri", str(tmp_path / "ref-l2"), *QUIET)
    assert ref["phase"] == "Succeeded" and ref["recoveries"] == [] and ref["digest"]["step"] == STEPS
    assert ref["stragglers"] == [], ref["stragglers"]  # noise flags no healthy rank
    rng = random.Random(SEED)
    rank, step = rng.randrange(WORLD), rng.randrange(3, 9)
    summary = lifeline_run(write_job(tmp_path / "job.yaml", _doc("slow", "replace")), tmp_path / "state",
                           "--persist-uri", str(tmp_path / "l2"), "--inject-failure", f"slow:rank={rank}:step={step}", *QUIET)
    assert summary["phase"] == "Succeeded", summary
    (found,) = summary["stragglers"]  # flagged once, before the move; the moved rank runs at full speed
    assert (found["rank"], found["action"], found["node"], found["generation"]) == (rank, "replace", f"node-{rank}", 0)
    assert step <= found["steps"][1] <= step + 20 and found["relative"] > THRESHOLD, (step, found)
    (rec,) = summary["recoveries"]
    assert rec["action"] == "ReplacePods" and rec["ranks"] == [rank] and rec["steps_lost"] <= 1, rec
    events = trainer_events(tmp_path / "state")
    slowed = [e for e in events if e["event"] == "step" and e.get("slow_seconds") is not None]
    assert slowed and {e["rank"] for e in slowed} == {rank} and min(e["step"] for e in slowed) == step
    assert all(e["generation"] == 0 for e in slowed), "the moved rank must run at full speed on its new node"
    moved = [e for e in events if e["event"] == "step" and e["rank"] == rank and e["generation"] == 1]
    assert moved and moved[-1]["step"] == STEPS, "the moved rank trained to the end in generation 1"
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"
