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

__all__ = ["FinalCheckpoint", "JobEnd"]


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


class JobEnd:
    """A rank that finished (its final checkpoint durable) stays until every rank finished.

    The trainer reports ``done`` once, then waits until every rank below the world size reported
    ``done`` in its generation: a failure of another rank after this one finished is then a recovery
    this rank takes part in (the new generation needs every rank), as it would while training. Exiting
    at once left nothing to rejoin on Kubernetes: the pod's ``restartPolicy: OnFailure`` does not
    restart a trainer that exited 0, so a rank restarted after the others had finished waited at the
    rendezvous until the engine replaced it again and again (``lifeline bench chaos --bed devcluster``
    trial 2006, issue 26; ``lifeline run`` restarted finished trainers itself).

    Args:
        ctx: the rank's :class:`~lifeline.runtime.RuntimeContext` (catalog, generation, progress).
        poll: seconds between two looks at the catalog's progress.
        timeout: seconds to wait in all (default: the settings' ``recovery_timeout_seconds``); past it the
            rank finishes alone (``done_alone`` is printed), as before.
    """

    def __init__(self, ctx: Any, *, poll: float = 0.1, timeout: float | None = None) -> None:
        self.ctx, self.poll = ctx, poll
        self.timeout = float(timeout if timeout is not None else getattr(ctx.settings, "recovery_timeout_seconds", 600.0))
        self._since: float | None = None

    @property
    def reported(self) -> bool:
        """Whether ``done`` was reported (since the last :meth:`reset`)."""
        return self._since is not None

    def reset(self) -> None:
        """Forget the ``done`` report (a recovery restored this rank: it reports ``done`` again)."""
        self._since = None

    def ended(self, **done: Any) -> bool:
        """Report ``done`` (with ``done``'s fields) on the first call, then look once: True when every rank
        reported ``done`` in this generation, there is no catalog, or the wait timed out; else sleep ``poll``
        and return False (the caller looks for a newer generation before calling again)."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
            self.ctx.report("done", **done)
            if hasattr(self.ctx, "recovering"):  # finished: no recovery beat (docs/control.md; done ranks
                self.ctx.recovering(False)       # are never judged frozen)
        catalog = getattr(self.ctx, "catalog", None)
        if catalog is None or self.ctx.world_size <= 1:
            return True
        try:
            reports = catalog.progress()
        except LifelineError:  # Redis away: keep waiting, it comes back or the timeout ends the wait
            reports = None
        if reports is not None and all(
                (r := reports.get(rank)) is not None and r.event == "done" and r.generation == self.ctx.generation
                for rank in range(self.ctx.world_size)):
            return True
        if now - self._since > self.timeout:
            self.ctx.report("done_alone", record=False, waited_seconds=round(now - self._since, 3))
            return True
        time.sleep(self.poll)
        return False
