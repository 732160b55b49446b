"""Acceptance: a Hugging Face ``transformers.Trainer`` script (examples/hf-trainer) under ``lifeline run``.

The example's TrainingJob runs ``examples/hf-trainer/train.py``: a GPT-2 from a config trained by
``lifeline.runtime.hf.LifelineTrainer`` (the Trainer's own loop, data loading and DDP through
``accelerate``). One run loses rank 1's node at step 2 (rank 0 recovers in its process: the Trainer's
loop is unwound and resumed at the restored step; rank 1's replacement restores in a new process) and
then rank 0's trainer is killed at step 4 (its new process restores from its sidecar). It ends
Succeeded, both recoveries from memory (L0/L1), and its final parameters (the L2 digest) equal a
failure-free run's, bit for bit. A Trainer that made a new LR scheduler on resume, skipped no
batches or restored the RNG at another point would differ (each was seen while this was written).
"""

from __future__ import annotations

import pytest

from ._jobs import example_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end, twice (still runs in CI)

STEPS = 6


def test_the_hf_trainer_example_recovers_in_and_out_of_its_process_and_ends_bit_identical(tmp_path):
    job = write_job(tmp_path / "job.yaml", example_doc("hf-trainer", STEPS))
    reference = lifeline_run(job, tmp_path / "ref", "--persist-uri", str(tmp_path / "ref-l2"), timeout=240)
    assert reference["phase"] == "Succeeded" and not reference["recoveries"], reference
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"),
                           "--inject-failure", "node:rank=1:step=2", "--inject-failure", "trainer:rank=0:step=4",
                           timeout=240)
    assert summary["phase"] == "Succeeded", summary
    lost, crashed = summary["recoveries"]
    assert (lost["action"], lost["ranks"], lost["restore_step"]) == ("ReplacePods", [1], 2), lost
    assert (crashed["action"], crashed["ranks"], crashed["restore_step"]) == ("RestartInPlace", [0], 4), crashed
    assert lost["tier"] in ("L0", "L1") and crashed["tier"] in ("L0", "L1"), (lost, crashed)
    events = trainer_events(tmp_path / "state")
    # rank 0 kept its process through the node loss: it restored step 2 in generation 1 without a new init
    inits = [(e["rank"], e["generation"]) for e in events if e["event"] == "init"]
    assert (0, 1) not in inits and (1, 1) in inits and (0, 2) in inits, inits
    assert {(e["rank"], e["generation"]) for e in events if e["event"] == "restore"} >= {(0, 1), (1, 1), (0, 2)}
    assert summary["digest"]["step"] == STEPS == reference["digest"]["step"]
    assert summary["digest"]["sha256"] == reference["digest"]["sha256"], \
        "final parameters differ from the failure-free run"
