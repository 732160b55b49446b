"""Pure builders of ``TrainingJob.status``: phase, step, conditions (``metav1.Condition``), recoveries.

The operator writes status through the status subresource only; these helpers compute the
new status from the old one so that re-running a reconcile with the same observations yields
the same status (a condition's ``lastTransitionTime`` moves only when its status changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from lifeline.api.recovery import RecoveryPlan
from lifeline.api.trainingjob import CONDITION_TYPES, PHASES, RecoveryAction, RecoveryRecord, TrainingJobStatus

__all__ = ["now", "known_status", "set_condition", "conditions_for_phase", "next_status", "recovery_record",
           "MAX_RECOVERIES_KEPT"]

MAX_RECOVERIES_KEPT = 20
"""``status.recoveries`` keeps the newest records only (the object must stay small)."""


def now() -> str:
    """The current UTC time, RFC 3339 with seconds (the ``metav1.Time`` wire form)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def known_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` reduced to the fields :class:`TrainingJobStatus` declares (others are dropped)."""
    fields = {f.alias or name for name, f in TrainingJobStatus.model_fields.items()}
    return {k: v for k, v in status.items() if k in fields}


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    at: str | None = None,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with condition ``type_`` set (the apimachinery ``SetStatusCondition`` rule).

    ``lastTransitionTime`` becomes ``at`` (default now) only when the condition is new or its
    ``status`` changes; reason, message and observedGeneration are always updated.

    Raises:
        ValueError: ``type_`` is not one of CONDITION_TYPES or ``status`` not True/False/Unknown.
    """
    if type_ not in CONDITION_TYPES:
        raise ValueError(f"condition type {type_!r} is not one of {CONDITION_TYPES}")
    if status not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status {status!r} must be True, False or Unknown")
    out = [dict(c) for c in conditions if c.get("type") != type_]
    old = next((c for c in conditions if c.get("type") == type_), None)
    changed = old is None or old.get("status") != status
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "lastTransitionTime": (at or now()) if changed else old["lastTransitionTime"],
        "reason": reason,
        "message": message,
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    out.append(cond)
    return sorted(out, key=lambda c: CONDITION_TYPES.index(c["type"]))


# phase -> (Ready, Progressing, Recovering, Degraded) statuses.
_PHASE_CONDITIONS = {
    "Pending": ("False", "True", "False", "False"),
    "Running": ("True", "True", "False", "False"),
    "Recovering": ("False", "True", "True", "True"),
    "Succeeded": ("False", "False", "False", "False"),
    "Failed": ("False", "False", "False", "True"),
}


def conditions_for_phase(
    conditions: Sequence[Mapping[str, Any]],
    phase: str,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    at: str | None = None,
) -> list[dict[str, Any]]:
    """Set all four conditions (Ready, Progressing, Recovering, Degraded) consistently with ``phase``.

    Raises:
        ValueError: ``phase`` is not one of PHASES.
    """
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES}")
    out = list(conditions)
    for type_, status in zip(CONDITION_TYPES, _PHASE_CONDITIONS[phase]):
        out = set_condition(
            out, type_, status, reason=reason, message=message, observed_generation=observed_generation, at=at
        )
    return out


def next_status(
    old: Mapping[str, Any] | None,
    *,
    phase: str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    step: int | None = None,
    complete_step: int | None = None,
    generation: int | None = None,
    restarts: int | None = None,
    replicas: int | None = None,
    layout: Mapping[str, int] | None = None,
    recovery: Mapping[str, Any] | None = None,
    stragglers: Sequence[Mapping[str, Any]] | None = None,
    at: str | None = None,
) -> dict[str, Any]:
    """The new status (wire form) from the old one and what this reconcile observed/decided.

    Fields passed as ``None`` keep their old value; ``step`` and ``complete_step`` never move
    backwards (a sidecar that lost its registration must not rewind the reported progress).
    ``recovery`` (a ``RecoveryRecord`` in wire form) replaces the record of the same
    generation or is appended; the newest :data:`MAX_RECOVERIES_KEPT` are kept. ``stragglers``
    (``StragglerRecord`` in wire form: the current generation's) replaces ``status.stragglers``.

    Returns:
        A dict validated by :class:`~lifeline.api.TrainingJobStatus` (raises ``ValidationError``
        if the inputs are inconsistent, e.g. a negative step).
    """
    st: dict[str, Any] = known_status(old or {})
    st["phase"] = phase
    st["message"] = message
    if observed_generation is not None:
        st["observedGeneration"] = observed_generation
    if step is not None:
        st["step"] = max(step, int(st.get("step", 0)))
    if complete_step is not None:
        prev = st.get("completeStep")
        st["completeStep"] = complete_step if prev is None else max(prev, complete_step)
    for key, value in (("generation", generation), ("restarts", restarts), ("replicas", replicas)):
        if value is not None:
            st[key] = value
    if layout is not None:
        st["layout"] = dict(layout)
    if recovery is not None:
        recs = [r for r in st.get("recoveries", []) if r.get("generation") != recovery.get("generation")]
        recs.append(dict(recovery))
        st["recoveries"] = sorted(recs, key=lambda r: r["generation"])[-MAX_RECOVERIES_KEPT:]
    if stragglers is not None:
        st["stragglers"] = [dict(s) for s in stragglers]
    st["conditions"] = conditions_for_phase(
        st.get("conditions", []), phase, reason=reason, message=message, observed_generation=observed_generation, at=at
    )
    return TrainingJobStatus.model_validate(st).to_wire()


def recovery_record(plan: RecoveryPlan, now: float) -> RecoveryRecord:
    """The ``status.recoveries[]`` record of a committed plan, started at ``now`` (seconds since the epoch)."""
    return RecoveryRecord(generation=plan.generation, kind=plan.action, ranks=list(plan.failed_ranks),
                          from_step=plan.restore_step, tier=plan.farthest_tier,
                          started_at=datetime.fromtimestamp(int(now), timezone.utc), reason=plan.reason[:1000],
                          layout=plan.layout if plan.action is RecoveryAction.RESHARD else None)
