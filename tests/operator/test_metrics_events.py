"""events.py knows a reason for every ladder rung and refuses others. (The operator's metrics are
asserted where the operator emits them: tests/operator/test_e2e.py scrapes the operator pod's /metrics
after a node loss it recovered.)"""

from __future__ import annotations

import pytest

from lifeline.api.trainingjob import RecoveryAction
from lifeline.operator import events


def test_every_recovery_action_has_an_event_reason():
    for action in RecoveryAction:
        assert action.value in events.REASONS
    assert events.REASONS["GiveUp"] == "Warning" and events.REASONS["ReplacePods"] == "Normal"


def test_unknown_reason_rejected():
    with pytest.raises(ValueError, match="not one of"):
        events.record({"metadata": {"name": "x"}}, "Exploded", "no")
