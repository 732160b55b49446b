"""Acceptance: invariant 1 (DESIGN.md) with ZeRO-1 optimizer-state sharding, under ``lifeline run``.

Layout pipeline=2 x data=2 with ``zero1: true``: every rank's checkpoint holds its data partition
of the AdamW moments only (``Zero1`` pattern). A trainer crash restores the rank's own partition
from L0; the run ends bit-identical to the failure-free one (both persist the same steps to L2, so
both digests are the L2 consolidation of the final step).
"""

from __future__ import annotations

import pytest

from ._jobs import job_doc, lifeline_run, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

STEPS = 6


def _doc(name: str) -> dict:
    doc = job_doc(name, pipeline=2, data=2, steps=STEPS)
    doc["spec"]["model"]["args"]["zero1"] = True
    doc["spec"]["checkpoint"]["persist"]["every"] = STEPS // 2
    doc["spec"]["recovery"].update(startupGraceSeconds=600, heartbeatSeconds=2, collectiveGraceSeconds=6)
    return doc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("refz")
    summary = lifeline_run(write_job(root / "job.yaml", _doc("refz")), root / "state", "--persist-uri",
                           str(root / "l2"), timeout=900)
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
    return summary, root


def test_zero1_run_with_a_trainer_crash_ends_bit_identical(reference, tmp_path):
    ref, root = reference
    manifest = (root / "l2" / "refz" / f"{STEPS:012d}" / "manifest.json").read_text()
    assert '"zero1"' in manifest, "the moments were not stored with the Zero1 pattern"
    # rank 1 = (pipeline 0, data 1): it holds the second partition of its stage's moments
    summary = lifeline_run(write_job(tmp_path / "job.yaml", _doc("crashz")), tmp_path / "state", "--persist-uri",
                           str(tmp_path / "l2"), "--inject-failure", "trainer:rank=1:step=3", timeout=900)
    assert summary["phase"] == "Succeeded"
    actions = [(r["action"], r["tier"], r["ranks"]) for r in summary["recoveries"]]
    assert actions == [("RestartInPlace", "L0", [1])], summary["recoveries"]
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"
