"""metrics.py is served by a real HTTP endpoint; events.py knows a reason for every ladder rung."""

from __future__ import annotations

import socket

import httpx
import pytest

from lifeline.api.trainingjob import RecoveryAction
from lifeline.operator import events, metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_endpoint_exposes_the_operator_series():
    metrics.FAILURES.labels("ns", "job", "NODE_LOST").inc()
    metrics.RECOVERY_SECONDS.labels("ReplacePods").observe(7.5)
    metrics.CHECKPOINT_LAG.labels("ns", "job").set(3)
    metrics.RECONCILE_SECONDS.observe(0.02)
    port = _free_port()
    server = metrics.serve(port, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    assert metrics.serve(-1) is None
    assert 'lifeline_operator_failures_total{job="job",kind="NODE_LOST",namespace="ns"} 1.0' in text
    assert 'lifeline_operator_recovery_seconds_bucket{action="ReplacePods",le="10.0"} 1.0' in text
    assert 'lifeline_operator_checkpoint_lag_steps{job="job",namespace="ns"} 3.0' in text
    assert "lifeline_operator_reconcile_seconds_count 1.0" in text


def test_every_recovery_action_has_an_event_reason():
    for action in RecoveryAction:
        assert action.value in events.REASONS
    assert events.REASONS["GiveUp"] == "Warning" and events.REASONS["ReplacePods"] == "Normal"


def test_unknown_reason_rejected():
    with pytest.raises(ValueError, match="not one of"):
        events.record({"metadata": {"name": "x"}}, "Exploded", "no")
