"""Acceptance: a ``torch.distributed.pipelining`` MoE of one's own (examples/pipelining-moe) under ``lifeline run``.

The example's TrainingJob (3 stages, ``Schedule1F1B``, ``recovery.localizedReplay``, sparse
checkpoints) runs its script, which uses only the public SDK (``init``, ``Pipeline``, ``train``). A
trainer crash of the middle stage recovers by localized replay: only that stage's rank restores
(its latest sparse window) and replays to the failure step from its neighbours' upstream logs;
the other stages' ranks keep their state and wait (asserted from their events), and the final
parameters and optimizer state (the L2 digest) are bit-identical to the failure-free run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ._jobs import TEST_ENV, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end (still runs in CI)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "pipelining-moe" / "train.py"
STEPS = 12


def _doc() -> dict:
    """The example's TrainingJob with the script's absolute path and the tests' timeouts; dense
    checkpoints only at the end, sparse windows of 3 steps: a failure at step 7 restores the window
    of step 3 (slot 0) and replays steps 4..7, applying the slots of steps 4 and 5 on the way."""
    doc = yaml.safe_load((ROOT / "examples" / "pipelining-moe" / "trainingjob.yaml").read_text())
    (trainer,) = doc["spec"]["template"]["spec"]["containers"]
    assert trainer["command"] == ["python", "examples/pipelining-moe/train.py"], trainer
    trainer["command"] = ["python", str(SCRIPT)]
    trainer["env"] = [{"name": k, "value": v} for k, v in TEST_ENV.items()]
    spec = doc["spec"]
    assert spec["steps"] == STEPS and spec["recovery"]["localizedReplay"] is True and spec["checkpoint"]["sparse"]
    spec["checkpoint"].update(every=STEPS, sparse={"window": 3})
    spec["checkpoint"]["persist"]["every"] = STEPS
    return doc


def _run(tmp_path: Path, name: str, *injections: str) -> dict:
    args = [a for inj in injections for a in ("--inject-failure", inj)]
    return lifeline_run(write_job(tmp_path / f"{name}.yaml", _doc()), tmp_path / name, "--persist-uri",
                        str(tmp_path / f"{name}-l2"), *args, timeout=240)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    summary = _run(tmp_path_factory.mktemp("pipelining-ref"), "ref")
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == [], summary
    return summary


def _localized(tmp_path: Path, name: str) -> list[dict]:
    """Generation 1's events; asserts that only rank 1 restored (its window of step 3) and replayed 4..7."""
    events = [e for e in trainer_events(tmp_path / name) if e.get("generation") == 1]
    restores = [e for e in events if e["event"] == "restore"]
    assert [(e["rank"], e["step"], e.get("source")) for e in restores] == [(1, 3, "window")], \
        "only the failed stage may restore, from its sparse window"
    assert {e["rank"] for e in events if e["event"] == "keep"} == {0, 2}
    assert sorted(e["step"] for e in events if e["event"] == "replay") == [4, 5, 6, 7]
    (done,) = [e for e in events if e["event"] == "replayed"]
    assert (done["rank"], done["step"], done["steps"]) == (1, 7, 4) and done["log_bytes"] > 0
    return events


def test_a_middle_stage_crash_replays_that_stage_alone_and_ends_bit_identical(reference, tmp_path):
    summary = _run(tmp_path, "crash", "trainer:rank=1:step=7")
    assert summary["phase"] == "Succeeded", summary
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"], rec["ranks"]) == ("LocalizedReplay", "L0", 3, [1]), rec
    assert rec["from_step"] == 7, rec
    _localized(tmp_path, "crash")
    assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"

