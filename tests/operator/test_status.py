"""status.py: conditions in the metav1.Condition shape, monotone progress, recoveries kept bounded."""

from __future__ import annotations

import pytest

from lifeline.operator.status import MAX_RECOVERIES_KEPT, next_status, set_condition


def _cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_phase_sets_all_four_conditions_with_observed_generation():
    st = next_status(None, phase="Running", reason="AllRanksReady", observed_generation=2, step=5, at="2026-01-01T00:00:00Z")
    assert [c["type"] for c in st["conditions"]] == ["Ready", "Progressing", "Recovering", "Degraded"]
    assert [c["status"] for c in st["conditions"]] == ["True", "True", "False", "False"]
    assert all(c["observedGeneration"] == 2 and c["reason"] == "AllRanksReady" for c in st["conditions"])
    assert st["phase"] == "Running" and st["step"] == 5 and st["observedGeneration"] == 2


def test_transition_time_moves_only_on_status_change():
    t0, t1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
    st = next_status(None, phase="Running", reason="AllRanksReady", at=t0)
    st = next_status(st, phase="Running", reason="AllRanksReady", message="step 9", at=t1)
    assert _cond(st, "Ready")["lastTransitionTime"] == t0
    assert _cond(st, "Ready")["message"] == "step 9"
    st = next_status(st, phase="Recovering", reason="ReplacePods", at=t1)
    assert _cond(st, "Ready")["status"] == "False" and _cond(st, "Ready")["lastTransitionTime"] == t1
    assert _cond(st, "Progressing")["lastTransitionTime"] == t0  # stayed True
    assert _cond(st, "Recovering")["status"] == "True"


def test_progress_never_moves_backwards():
    st = next_status(None, phase="Running", reason="r", step=40, complete_step=39)
    st = next_status(st, phase="Running", reason="r", step=12, complete_step=10)
    assert (st["step"], st["completeStep"]) == (40, 39)
    st = next_status(st, phase="Running", reason="r", step=41, complete_step=41)
    assert (st["step"], st["completeStep"]) == (41, 41)


def test_recoveries_replace_by_generation_and_stay_bounded():
    st = None
    for g in range(1, MAX_RECOVERIES_KEPT + 6):
        rec = {"generation": g, "kind": "ReplacePods", "ranks": [1], "startedAt": "2026-01-01T00:00:00Z"}
        st = next_status(st, phase="Recovering", reason="ReplacePods", generation=g, restarts=g, recovery=rec)
    done = {"generation": g, "kind": "ReplacePods", "ranks": [1], "startedAt": "2026-01-01T00:00:00Z",
            "resumedAt": "2026-01-01T00:00:07Z", "seconds": 7.0, "fromStep": 30, "tier": "L1"}
    st = next_status(st, phase="Running", reason="Recovered", recovery=done)
    assert len(st["recoveries"]) == MAX_RECOVERIES_KEPT
    assert st["recoveries"][-1]["seconds"] == 7.0 and st["recoveries"][-1]["generation"] == g
    assert st["recoveries"][0]["generation"] == g - MAX_RECOVERIES_KEPT + 1
    assert (st["generation"], st["restarts"]) == (g, g)


def test_unknown_status_keys_are_dropped():
    st = next_status({"phase": "Running", "kopf": {"progress": {}}}, phase="Running", reason="r")
    assert "kopf" not in st


def test_bad_condition_rejected():
    with pytest.raises(ValueError, match="not one of"):
        set_condition([], "Healthy", "True", reason="x")
    with pytest.raises(ValueError, match="True, False or Unknown"):
        set_condition([], "Ready", "yes", reason="x")
