"""Regression tests of issue 22's defects 1 and 4 with ``lifeline run`` (real processes, Redis, gloo, sidecars).

* Defect 1: with sparse checkpoints **and** dense copies every step (the defaults a user starts
  from), a failure at a step that starts a window was restored from the window whose later slots
  were never captured: the other operators kept a fresh trainer's zero Adam moments and the job
  ended Succeeded with parameters different from the failure-free run. A restore now reads exactly
  the copy its plan names.
* Defect 4 (verified recovery): a recomputed step is compared with the copy saved at that step before
  the failure; a difference is a failed recovery, reported, and the next plan restores a verified
  copy, so the job still ends bit-identical instead of Succeeded with a wrong state.

The failure-free reference is one 3-stage run: checkpoint settings do not change training, so every
run here must end with its digest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

STAGES = 3


def _doc(name: str, *, localized: bool = True, sparse: int | None = 3, env: dict[str, str] | None = None) -> dict:
    doc = job_doc(name, pipeline=STAGES, data=1)
    spec = doc["spec"]
    spec["model"]["args"].update(n_layers=STAGES, micro_batches=4, grad_clip=0.5, warmup_steps=3)
    spec["recovery"]["localizedReplay"] = localized
    spec["recovery"].pop("elastic")
    if sparse is not None:
        spec["checkpoint"]["sparse"] = {"window": sparse}
    for key, value in (env or {}).items():
        spec["template"]["spec"]["containers"][0]["env"].append({"name": key, "value": value})
    return doc


def _run(tmp_path: Path, doc: dict, *injections: str) -> dict:
    args = [a for inj in injections for a in ("--inject-failure", inj)]
    return lifeline_run(write_job(tmp_path / "job.yaml", doc), tmp_path / "state", "--persist-uri",
                        str(tmp_path / "l2"), *args)


def _events(tmp_path: Path, event: str) -> list[dict]:
    return [e for e in trainer_events(tmp_path / "state") if e.get("event") == event]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("refcopies")
    summary = _run(root, _doc("refcopies", sparse=None))
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    return summary


@pytest.mark.parametrize("localized", [True, False], ids=["localized", "global"])
def test_a_failure_at_a_window_start_restores_the_dense_copy_the_plan_names(reference, tmp_path, localized):
    summary = _run(tmp_path, _doc("winstart", localized=localized), "trainer:rank=1:step=6")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["restore_step"]) == ("LocalizedReplay" if localized else "RestartInPlace", 6)
    restores = [e for e in _events(tmp_path, "restore") if e["generation"] == 1]
    assert restores and all(e.get("source") != "window" for e in restores), restores
    assert {e["rank"] for e in restores} == ({1} if localized else {0, 1, 2})
    assert summary["phase"] == "Succeeded"
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"


def _lose_every_node(step: int) -> list[str]:
    return [f"node:rank={r}:step={step}" for r in range(STAGES)]


def test_a_rollback_re_runs_steps_saved_before_the_failure_and_verifies_the_first_one(reference, tmp_path):
    """Every node lost at step 10: the memory copies are gone, all ranks roll back to L2's step 8 and
    re-run 9 and 10, whose copies from before the failure still have their checksums recorded."""
    summary = _run(tmp_path, _doc("verifyok", sparse=None), *_lose_every_node(10))
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"]) == ("Rollback", "L2", 8)
    verified = [e for e in _events(tmp_path, "verified") if e["generation"] == 1]
    assert {(e["rank"], e["step"], e["restored"]) for e in verified} == {(r, 9, 8) for r in range(STAGES)}
    assert _events(tmp_path, "verify_failed") == []
    assert summary["digest"] == reference["digest"]


def test_a_recomputation_that_differs_is_caught_and_the_job_still_ends_bit_identical(reference, tmp_path):
    """Rank 1's re-run of step 9 comes out different (LIFELINE_FAULT_PERTURB, as a non-deterministic
    kernel would): the check at step 9 fails, the recovery is reported failed, and the next plan
    restores a verified copy: the job never ends Succeeded with the wrong state."""
    doc = _doc("verifybad", sparse=None, env={"LIFELINE_FAULT_PERTURB": "1:9"})
    summary = _run(tmp_path, doc, *_lose_every_node(10))
    (failed,) = _events(tmp_path, "verify_failed")
    assert (failed["rank"], failed["step"], failed["generation"], failed["restored"]) == (1, 9, 1, 8)
    assert failed["entries"], failed
    first, second = summary["recoveries"][:2]
    assert (first["action"], first["restore_step"]) == ("Rollback", 8)
    assert second["restore_step"] is not None and second["restore_step"] >= 8, second
    assert summary["phase"] == "Succeeded"
    assert summary["digest"] == reference["digest"], "the perturbed recomputation reached the final state"
