"""Chaos trials under ``lifeline run`` (issue 15): real processes, Redis, MinIO, gloo.

A failure-free reference, then seeded and hand-picked trials that between them inject every fault
kind — trainer and sidecar SIGKILL, node loss, hang, Redis restart, MinIO outage, a flipped byte in an
L0, an L1 and an L2 copy, and faults during a recovery — each checked as ``lifeline bench chaos``
checks a trial (:func:`lifeline.bench._chaos_trial.verdict`): the job finished, bit-identical to the
reference, the latest complete step never moved backwards, nothing torn at any tier, every corrupted
copy detected. The hang trial also checks the honest accounting: the engine finds the hang after
``hangTimeoutSeconds`` (not gloo), and the time lost counts from the SIGSTOP.
"""

from __future__ import annotations

import json

import pytest

from lifeline.bench._chaos_schedule import TrialSpec
from lifeline.bench._chaos_trial import run_trial, time_lost, verdict
from lifeline.bench.chaos import HANG_TIMEOUT_SECONDS, TEST_ENV, job_doc
from lifeline.launch.inject import parse_injection

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

DOC = job_doc("chaos")
WORLD, STEPS = 2, 12


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("chaos-ref")
    ref = run_trial(DOC, TrialSpec(-1, ()), root / "state", persist_uri=f"file://{root / 'l2'}", timeout=900)
    assert ref["phase"] == "Succeeded" and ref["recoveries"] == [] and ref["digest"]["source"] == "L2"
    assert verdict(ref, None) == [], ref.get("audit")
    return ref


def _trial(tmp_path, reference, *faults: str, s3: bool = False, uri: str | None = None) -> dict:
    spec = TrialSpec(0, tuple(parse_injection(f, world_size=WORLD, steps=STEPS) for f in faults))
    uri = uri or ("s3://lifeline/chaos" if s3 else f"file://{tmp_path / 'l2'}")
    s = run_trial(DOC, spec, tmp_path / "state", persist_uri=uri, timeout=900)
    problems = verdict(s, reference)
    assert problems == [], json.dumps({"problems": problems, "recoveries": s["recoveries"], "faults": s["faults"]},
                                      indent=1)[:6000]
    assert [f["fault"] for f in s["faults"]] == [str(parse_injection(f)) for f in faults], "a fault did not fire"
    return s


def _detected(s: dict, tier: str) -> None:
    copies = [c for f in s["faults"] for c in f["copies"] if c["tier"] == tier]
    assert copies, f"no {tier} copy was flipped"
    reported = {(r["step"], r["rank"], r["tier"]) for r in s["corruption_reports"]}
    assert any((c["step"], c["rank"], tier) in reported for c in copies), (copies, s["corruption_reports"])
    assert s["corruption"]["used"] == []


def test_hang_is_found_by_the_engine_and_time_lost_counts_from_the_sigstop(tmp_path, reference):
    s = _trial(tmp_path, reference, "hang:rank=1:step=4")
    (rec,) = s["recoveries"]
    assert rec["failures"][0].startswith("HANG") and rec["fault"] == "injected"
    collective = float(TEST_ENV["LIFELINE_COLLECTIVE_TIMEOUT_SECONDS"])
    assert HANG_TIMEOUT_SECONDS <= rec["detect_seconds"] < collective, rec  # the engine, not gloo's timeout
    assert rec["timeline"]["failed_at"] == s["faults"][0]["at"]  # counted from the SIGSTOP
    assert rec["to_same_step_seconds"] >= rec["seconds"] >= rec["detect_seconds"]
    assert s["recovery_seconds"] >= HANG_TIMEOUT_SECONDS and s["time_lost_seconds"] >= s["recovery_seconds"]
    (lost,) = time_lost(s)
    assert lost["seconds"] == pytest.approx(rec["to_same_step_seconds"], abs=1e-3)


def test_trainer_kill_redis_restart_and_a_flipped_l0_copy(tmp_path, reference):
    s = _trial(tmp_path, reference, "trainer:rank=0:step=3", "redis:step=5", "flip:rank=1:step=8:tier=L0")
    assert s["service_restarts"] == {"redis": 1}
    assert [r["action"] for r in s["recoveries"]] == ["RestartInPlace", "RestartInPlace"]
    _detected(s, "L0")


def test_minio_outage_sidecar_kill_and_a_hang_during_its_recovery(tmp_path, reference):
    s = _trial(tmp_path, reference, "minio:step=3:seconds=3", "sidecar:rank=1:step=5",
               "hang:rank=0:step=5:when=recovery", s3=True)
    assert s["service_restarts"] == {"minio": 1}
    during = s["faults"][2]
    first = s["recoveries"][0]["timeline"]
    assert first["published_at"] <= during["at"] and "resumed_at" not in first  # it fired mid-recovery


def test_flipped_l1_and_l2_copies_a_kill_during_a_recovery_and_a_node_loss(tmp_path, reference):
    """L2 on Google Cloud Storage (``gs://``: ``lifeline run`` starts fake-gcs-server as it starts MinIO
    for ``s3://``). Rank 0's only L1 holder is rank 1: its trainer (not its node: the flipped copy lives
    in its sidecar) dies while rank 0's replacement reads that copy."""
    s = _trial(tmp_path, reference, "flip:rank=0:step=3:tier=L1", "trainer:rank=1:step=3:when=recovery",
               "node:rank=0:step=6", "flip:rank=1:step=9:tier=L2", uri="gs://lifeline/chaos")
    _detected(s, "L1")
    _detected(s, "L2")
    assert "ReplacePods" in {r["action"] for r in s["recoveries"]}


def test_l2_on_azure_blob_storage_survives_a_node_loss_and_a_flipped_l2_copy(tmp_path, reference):
    """``persist.uri: az://...``: ``lifeline run`` starts Azurite as it starts MinIO for ``s3://``; the run
    ends bit-identical to the reference (whose L2 is a directory), the flipped L2 blob is detected."""
    s = _trial(tmp_path, reference, "node:rank=1:step=5", "flip:rank=0:step=9:tier=L2", uri="az://lifeline/chaos")
    _detected(s, "L2")
    assert s["digest"]["source"] == "L2" and "ReplacePods" in {r["action"] for r in s["recoveries"]}
