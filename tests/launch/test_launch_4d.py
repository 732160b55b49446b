"""Acceptance: invariant 1 (DESIGN.md) with every parallel dimension, under ``lifeline run``.

Layout tensor=2 x pipeline=2 x data=1 x expert=2 (8 ranks: Megatron tensor groups, GPipe stages,
expert all-to-all): a failure-free run, and the same spec with a trainer crash and a node loss
injected, end with bit-identical final parameters. Both runs persist the same steps to L2, so
both digests are the L2 consolidation of the final step.
"""

from __future__ import annotations

import pytest

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

STEPS = 6
LAYOUT = {"tensor": 2, "pipeline": 2, "data": 1, "expert": 2}
WORLD = 8


def _doc(name: str) -> dict:
    doc = job_doc(name, pipeline=2, data=1, steps=STEPS)
    doc["spec"]["replicas"] = WORLD
    doc["spec"]["layout"] = dict(LAYOUT)
    doc["spec"]["checkpoint"]["persist"]["every"] = STEPS // 2
    # 16 processes importing torch at once on 2 shared cores: sidecars may take minutes to register
    doc["spec"]["recovery"].update(startupGraceSeconds=600, heartbeatSeconds=2, collectiveGraceSeconds=6)
    return doc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref4d")
    summary = lifeline_run(write_job(root / "job.yaml", _doc("ref4d")), root / "state", "--persist-uri",
                           str(root / "l2"), timeout=900)
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
    assert summary["layout"] == LAYOUT
    return summary


def test_trainer_crash_and_node_loss_in_a_4d_layout_end_bit_identical(reference, tmp_path):
    # rank 5 = (tensor 1, expert 0, pipeline 1): a tensor and expert peer of the last stage;
    # rank 2 = (tensor 0, expert 1, pipeline 0): its node is lost later in the run
    summary = lifeline_run(write_job(tmp_path / "job.yaml", _doc("fail4d")), tmp_path / "state", "--persist-uri",
                           str(tmp_path / "l2"), "--inject-failure", "trainer:rank=5:step=2",
                           "--inject-failure", "node:rank=2:step=4", timeout=900)
    assert summary["phase"] == "Succeeded"
    actions = [(r["action"], r["tier"], r["ranks"]) for r in summary["recoveries"]]
    assert actions == [("RestartInPlace", "L0", [5]), ("ReplacePods", "L1", [2])], summary["recoveries"]
    restores = [e for e in trainer_events(tmp_path / "state") if e.get("event") == "restore" and e["rank"] == 2]
    assert restores, "the replacement trainer of rank 2 never restored"
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"
