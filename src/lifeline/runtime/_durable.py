"""A finished rank stays until the job's final checkpoint is durable (committed to L2).

Without it a job is Succeeded when its trainers exit, which can be before their sidecars have
persisted the final step: a node lost in that gap (found by ``lifeline bench chaos`` seed 1043)
leaves a Succeeded job whose last checkpoint never reached L2. Holding the trainer instead keeps the
job Running, so such a loss is an ordinary recovery: the plan restores the final step (from L0/L1),
every rank saves it again (a replacement sidecar holds nothing of it) and waits again.
"""

from __future__ import annotations

import time
from typing import Any

from lifeline.errors import LifelineError
from lifeline.runtime._hooks import KnowsDurability

__all__ = ["FinalCheckpoint"]


class FinalCheckpoint:
    """Whether checkpoint ``steps`` (the job's last step) is committed to L2, and the wait for it.

    Applies only when the final step is one the sidecars persist (``persist_every`` > 0 dividing
    ``steps``, from ``LIFELINE_PERSIST_EVERY``) and the checkpointer can tell
    (``committed_to_l2(step)``, e.g. :class:`~lifeline.runtime.SidecarCheckpointer` with
    ``LIFELINE_PERSIST_URI``); otherwise :meth:`durable` is true at once.

    Args:
        ctx: the rank's :class:`~lifeline.runtime.RuntimeContext` (settings, progress reports).
        checkpointer: the rank's checkpointer.
        steps: the job's last step.
        poll: seconds between checks of L2.
        report_every: seconds between ``awaiting_l2`` progress reports (they tell the controller the
            rank is alive: no step progress is expected while it waits).
        timeout: seconds to wait in all before giving up (``final_not_durable`` is reported and the
            rank finishes; default: the settings' ``recovery_timeout_seconds``).
    """

    def __init__(self, ctx: Any, checkpointer: Any, steps: int, *, poll: float = 0.2, report_every: float = 5.0,
                 timeout: float | None = None) -> None:
        every = int(getattr(ctx.settings, "persist_every", 0) or 0)
        self.applies = every > 0 and steps > 0 and steps % every == 0 and isinstance(checkpointer, KnowsDurability)
        self.ctx, self.checkpointer, self.steps, self.poll, self.report_every = ctx, checkpointer, steps, poll, report_every
        self.timeout = float(timeout if timeout is not None else getattr(ctx.settings, "recovery_timeout_seconds", 600.0))
        self.resave = False  # set after a restore of the final step: this generation's sidecars need it again
        self._done = not self.applies
        self._since: float | None = None
        self._reported = 0.0

    def durable(self) -> bool:
        """True once checkpoint ``steps`` is committed to L2 (or the wait does not apply or gave up)."""
        if not self._done:
            try:
                self._done = bool(self.checkpointer.committed_to_l2(self.steps))
            except (LifelineError, OSError):  # an L2 outage: keep waiting, the sidecar retries its upload
                self._done = False
        return self._done

    def wait_once(self, save: Any) -> None:
        """One round of the wait: save the final step again if a restore asked for it (``save()``),
        report progress now and then, sleep ``poll``; past ``timeout`` report ``final_not_durable``
        and stop waiting."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self.resave:
            save()
            self.resave = False
        if now - self._reported >= self.report_every:
            self.ctx.report("awaiting_l2", step=self.steps, waited_seconds=round(now - self._since, 3))
            self._reported = now
        if now - self._since > self.timeout:
            self.ctx.report("final_not_durable", step=self.steps, waited_seconds=round(now - self._since, 3))
            self._done = True
            return
        time.sleep(self.poll)
