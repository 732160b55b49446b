"""What the operator remembers between reconciles, kept on the TrainingJob itself (annotations).

The operator holds no state in memory: everything it must know to resume after being killed
is either observable (pods, nodes, the catalog) or recorded here, written *before* it acts:

=================================  ===========================================================
``lifeline.dev/generation``        the current generation (the latest plan's)
``lifeline.dev/plan``              the current recovery plan (:meth:`RecoveryPlan.to_json`)
``lifeline.dev/applied``           the generation whose pods were all created
``lifeline.dev/handled``           pod UID -> container -> failed runs already answered
``lifeline.dev/cool-downs``        node -> expiry (seconds since epoch) for this job's pods
=================================  ===========================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lifeline.api.recovery import RecoveryPlan

__all__ = ["PREFIX", "Recorded"]

PREFIX = "lifeline.dev/"
_GEN, _PLAN, _APPLIED, _HANDLED, _COOL = (PREFIX + k for k in ("generation", "plan", "applied", "handled", "cool-downs"))


@dataclass(frozen=True)
class Recorded:
    """The operator's record of one job (see the module docstring for the annotations).

    Attributes:
        generation: the current generation (0 before any recovery).
        plan: the recovery plan that started ``generation`` (``None`` at generation 0).
        applied: the latest generation whose pods were all created (-1: none yet).
        handled: pod UID -> container name -> failed runs already answered by a plan.
        cool_downs: node -> expiry, seconds since the epoch.
    """

    generation: int = 0
    plan: RecoveryPlan | None = None
    applied: int = -1
    handled: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cool_downs: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str] | None) -> Recorded:
        """Read the record from ``metadata.annotations`` (missing or unreadable keys: defaults)."""
        ann = annotations or {}

        def load(key: str, default: Any) -> Any:
            try:
                return json.loads(ann[key]) if key in ann else default
            except ValueError:
                return default

        plan = None
        if ann.get(_PLAN):
            try:
                plan = RecoveryPlan.from_json(ann[_PLAN])
            except (ValueError, KeyError, TypeError):
                plan = None
        return cls(
            generation=int(load(_GEN, 0)),
            plan=plan,
            applied=int(load(_APPLIED, -1)),
            handled={str(k): {str(c): int(n) for c, n in v.items()} for k, v in load(_HANDLED, {}).items()},
            cool_downs={str(k): float(v) for k, v in load(_COOL, {}).items()},
        )

    def commit_patch(self, plan: RecoveryPlan, handled: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
        """The metadata merge patch recording ``plan`` as current (written before acting on it)."""
        return {
            "metadata": {
                "annotations": {
                    _GEN: str(plan.generation),
                    _PLAN: plan.to_json(),
                    _HANDLED: json.dumps(dict(handled), sort_keys=True),
                    _COOL: json.dumps(dict(plan.cool_downs), sort_keys=True),
                }
            }
        }

    @staticmethod
    def applied_patch(generation: int) -> dict[str, Any]:
        """The metadata merge patch recording that every pod of ``generation`` was created."""
        return {"metadata": {"annotations": {_APPLIED: str(generation)}}}
