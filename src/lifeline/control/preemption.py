"""Preemptions as the decision engine sees them (pure).

A trainer told to leave (SIGTERM, :mod:`lifeline.runtime._preempt`) checkpoints the step it completed
to L1 and reports ``preempted`` with that step before it exits; then its pod, or its node, goes. The
failure the runner observes is the ordinary one (``NODE_LOST``, ``POD_LOST``, a trainer exit): the
ladder's plan does not change — every rank holds the preempted rank's step (its own copy in L0, the
preempted one's in a peer's L1), so ``ReplacePods`` (or ``RestartInPlace``) restores exactly that
step. :func:`annotate` makes the plan's reason say it was a preemption, and whether any step was lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from lifeline.api.recovery import RecoveryPlan
from lifeline.api.trainingjob import RecoveryAction
from lifeline.control.progress import Progress

__all__ = ["preempted", "annotate"]


def preempted(progress: Progress, generation: int) -> dict[int, int]:
    """rank -> the step it checkpointed before it left, for the ranks whose latest report in
    ``generation`` (or later) is ``preempted``."""
    return {rank: step for rank, gen, event, step in progress.latest if event == "preempted" and gen >= generation}


def annotate(plan: RecoveryPlan, left: Mapping[int, int]) -> RecoveryPlan:
    """``plan`` with its reason prefixed by the preemption of the ranks of ``left`` (rank -> the step it
    checkpointed) that its failures name; ``plan`` itself when none, or for a ``GiveUp``.

    The prefix says ``0 steps lost`` when the plan restores the newest step a preempted rank saved,
    else how many steps behind it the restore is (a plan without a restore step counts from 0)."""
    failed = {r for f in plan.failures for r in f.ranks}
    hit = {r: s for r, s in left.items() if r in failed}
    if not hit or plan.action is RecoveryAction.GIVE_UP:
        return plan
    saved = max(hit.values())
    lost = saved - (plan.restore_step or 0)
    ranks = ", ".join(str(r) for r in sorted(hit))
    why = (f"preemption of rank{'s' if len(hit) > 1 else ''} {ranks} (checkpointed step {saved} to L1 before "
           f"leaving): {'0 steps lost' if lost <= 0 else f'{lost} steps lost (restoring step {plan.restore_step})'}")
    return replace(plan, reason=f"{why}; {plan.reason}")
