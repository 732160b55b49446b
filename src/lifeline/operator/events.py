"""Kubernetes Events for every decision the operator takes, each with a CamelCase reason.

Events go through kopf (``kopf.event``), which posts ``core/v1`` Events referring to the
TrainingJob, so ``kubectl describe trainingjob`` shows the operator's decisions in order.
The reasons are a closed set (:data:`REASONS`): dashboards and tests match on them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

__all__ = ["REASONS", "record"]

log = logging.getLogger("lifeline.operator.events")

REASONS = {
    # normal
    "SecretCreated": "Normal",
    "NetworkPolicyCreated": "Normal",
    "DisruptionBudgetCreated": "Normal",
    "PodCreated": "Normal",
    "Running": "Normal",
    "Succeeded": "Normal",
    "RestartInPlace": "Normal",
    "ReplacePods": "Normal",
    "LocalizedReplay": "Normal",
    "Rollback": "Normal",
    "Reshard": "Normal",
    "Recovered": "Normal",
    "StragglerReplaced": "Normal",  # a straggler's pod deleted: it moves to another node (docs/stragglers.md)
    "GrowDeferred": "Normal",  # a grow's step left sidecar memory before it was published: planned again
    "RecoveryDeferred": "Warning",  # a recovery's step left sidecar memory before it was published: planned again
    # warnings
    "FailureDetected": "Warning",
    "StragglerDetected": "Warning",  # a rank computes slower than threshold x the others (docs/stragglers.md)
    "InvalidSpec": "Warning",
    "GiveUp": "Warning",
    "Failed": "Warning",
}
"""Every event reason the operator emits, with its Kubernetes event type."""


def record(body: Mapping[str, Any], reason: str, message: str) -> None:
    """Post an Event about ``body`` (a TrainingJob) and log it.

    Args:
        body: the TrainingJob object (needs ``apiVersion``, ``kind``, ``metadata``).
        reason: one of :data:`REASONS` (its type, Normal or Warning, comes from there).
        message: what was decided and why (Kubernetes truncates it at 1 KiB).

    Raises:
        ValueError: ``reason`` is not in :data:`REASONS`.
    """
    if reason not in REASONS:
        raise ValueError(f"event reason {reason!r} is not one of {sorted(REASONS)}")
    type_ = REASONS[reason]
    name = (body.get("metadata") or {}).get("name")
    (log.warning if type_ == "Warning" else log.info)("%s %s: %s", name, reason, message)
    try:
        kopf.event(dict(body), type=type_, reason=reason, message=message[:1024])
    except LookupError:  # outside a running kopf operator (e.g. a one-off reconcile): logged only
        pass
