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
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lifeline.api.recovery import RecoveryPlan
from lifeline.errors import LifelineError

__all__ = ["PREFIX", "Recorded"]

log = logging.getLogger("lifeline.operator")

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
        """Read the record from ``metadata.annotations``. A missing key, or one that does not read
        as its shape (anyone who may edit the job may write these annotations: ``"[1]"`` for a
        generation, a list for the cool-downs), gives that field's default, logged; never an error."""
        ann = annotations or {}

        def read(key: str, default: Any, convert: Any) -> Any:
            if key not in ann:
                return default
            try:
                return convert(json.loads(ann[key]))
            except (ValueError, TypeError, AttributeError, KeyError, OverflowError, LifelineError) as err:
                log.warning("ignoring the unreadable annotation %s=%.200r: %s", key, ann[key], err)
                return default

        def whole(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{v!r} is not an integer")
            return v

        plan = read(_PLAN, None, RecoveryPlan.from_wire) if ann.get(_PLAN) else None
        return cls(
            generation=read(_GEN, 0, whole),
            plan=plan,
            applied=read(_APPLIED, -1, whole),
            handled=read(_HANDLED, {}, lambda v: {str(k): {str(c): whole(n) for c, n in c_n.items()}
                                                  for k, c_n in v.items()}),
            cool_downs=read(_COOL, {}, lambda v: {str(k): float(t) for k, t in v.items()}),
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

    def cool_down_patch(self, node: str, until: float) -> dict[str, Any]:
        """The metadata merge patch adding ``node`` to the cool-downs until ``until`` (seconds since the
        epoch; a later expiry already recorded is kept): new pods avoid it (a straggler's node)."""
        cool = {**self.cool_downs, node: max(until, self.cool_downs.get(node, until))}
        return {"metadata": {"annotations": {_COOL: json.dumps(cool, sort_keys=True)}}}

    @staticmethod
    def applied_patch(generation: int) -> dict[str, Any]:
        """The metadata merge patch recording that every pod of ``generation`` was created."""
        return {"metadata": {"annotations": {_APPLIED: str(generation)}}}
