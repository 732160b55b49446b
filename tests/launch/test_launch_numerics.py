"""Acceptance (issue 27, NaN and loss spikes): ``lifeline run --inject-failure nan:rank=R:step=S`` poisons
rank R's batch of step S; the numerics check stops the update on every rank, re-runs the step, finds the
same NaN again (a bad batch), skips it and records it; the run ends bit-identical to a failure-free run
that skips step S (``spec.recovery.lossSpike.skipSteps``). In the same run a transient NaN of another
rank at a later step T (``transient=1``) is clean on its re-run: a faulty rank, reported; that rank
fails, the engine restarts it, the step is re-run and the result is still the same. docs/numerics.md."""

from __future__ import annotations

import random

import pytest

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

STEPS, PIPELINE, DATA = 6, 2, 1  # two stages: the NaN of one must stop the other's update too


def _doc(name: str, **loss_spike) -> dict:
    doc = job_doc(name, pipeline=PIPELINE, data=DATA, steps=STEPS)
    doc["spec"]["checkpoint"].update(peerReplicas=0, persist={"every": STEPS, "uri": "file:///unused"})
    doc["spec"]["recovery"] = {"maxRestarts": 2, "hangTimeoutSeconds": 120, "lossSpike": loss_spike}
    return doc


def test_an_injected_nan_batch_is_skipped_and_the_run_equals_one_that_skips_it(tmp_path):
    rng = random.Random(27)
    rank, step = rng.randrange(PIPELINE * DATA), rng.randrange(2, STEPS - 1)
    flaky, later = (rank + 1) % (PIPELINE * DATA), rng.randrange(step + 1, STEPS)
    faults = ("--inject-failure", f"nan:rank={rank}:step={step}",
              "--inject-failure", f"nan:rank={flaky}:step={later}:transient=1")
    runs = {}
    for name, spec, args in (("nan", {}, faults),
                             ("skip", {"skipSteps": [step]}, ())):
        root = tmp_path / name
        job = write_job(tmp_path / f"{name}.yaml", _doc(f"numerics-{name}", **spec))
        summary = lifeline_run(job, root / "state", "--persist-uri", str(root / "l2"), "--spare-nodes", "0",
                               "--spares-per-node", "0", *args, timeout=120)
        assert summary["phase"] == "Succeeded", summary
        assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
        runs[name] = summary, trainer_events(root / "state")
    (nan, nan_events), (skip, skip_events) = runs["nan"], runs["skip"]
    skipped = [e for e in nan_events if e.get("event") == "skipped_batch"]
    assert sorted(e["rank"] for e in skipped) == list(range(PIPELINE * DATA)), skipped  # every rank skipped it
    assert {(e["step"], e["reason"], tuple(e["ranks"])) for e in skipped} == {(step, "nan", (rank,))}
    assert skip["recoveries"] == []
    (rec,) = nan["recoveries"]  # the faulty rank failed after its step: restarted, the step re-run
    assert rec["ranks"] == [flaky] and rec["restore_step"] == later - 1, rec
    faulty = [e for e in nan_events if e.get("event") == "faulty_rank"]
    assert {(e["step"], e["reason"], tuple(e["ranks"])) for e in faulty} == {(later, "nan", (flaky,))}, faulty
    assert sorted(e["rank"] for e in faulty) == list(range(PIPELINE * DATA))  # every rank reported it, once
    assert {(e["step"], e["reason"]) for e in skip_events if e.get("event") == "skipped_batch"} == {(step, "configured")}
    assert nan["digest"] == skip["digest"], "the run that skipped the NaN batch differs from the failure-free one"
