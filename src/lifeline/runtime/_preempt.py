"""Preemption: a trainer told to leave (SIGTERM) checkpoints the step it completed to L1, then exits.

Kubernetes deletes a preempted pod with SIGTERM and kills it ``terminationGracePeriodSeconds`` later
(``lifeline run --inject-failure preempt:rank=R:step=S:seconds=G`` does the same locally). With
:data:`PREEMPT_ENV` set to that grace (seconds), :meth:`Preemption.install` replaces SIGTERM's default
(die at once) by a handler that only sets a flag; :func:`run_training` asks :meth:`Preemption.boundary`
at the end of every step (after its report, save and fault hold):

* **Agreement** (``checkpoint.every > 1`` only): one all-reduce (MAX) of a one-element flag on the
  default process group tells every rank whether any rank was told to leave; with ``every == 1`` every
  rank saved the step already and nothing is exchanged.
* **Every rank** then holds the step it completed: the ranks that did not save it (not a checkpoint
  step) save it now, so the recovery restores that step on every rank: zero steps lost.
* **The preempted rank** waits until a peer's sidecar holds its copy (the catalog records an L1
  holding of ``(step, rank)``; also L2 when present), at most until :data:`MARGIN_SECONDS` before the
  grace ends, reports ``preempted`` (``step``, ``tiers``, ``seconds`` since the signal) and exits
  :data:`EXIT_PREEMPTED`. The others train on: their next collective fails once it left, and the
  engine's plan (which names the preemption, :mod:`lifeline.control.preemption`) restores that step.

Without :data:`PREEMPT_ENV` nothing changes (SIGTERM kills the trainer, no collective is added).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PREEMPT_ENV", "EXIT_PREEMPTED", "MARGIN_SECONDS", "Preemption", "requested"]

PREEMPT_ENV = "LIFELINE_PREEMPT_GRACE_SECONDS"
"""The grace (seconds) between SIGTERM and SIGKILL; set, > 0: preemption handling is on."""
EXIT_PREEMPTED = 143
"""The exit status of a trainer that left after a preemption (128 + SIGTERM, as the kubelet reports it)."""
MARGIN_SECONDS = 1.0
"""The wait for L1 ends this long before the grace does (the exit and its report need time too)."""
POLL_SECONDS = 0.02

_requested: float | None = None
"""When (``time.monotonic``) this process got SIGTERM under preemption handling; ``None``: not."""


def requested() -> bool:
    """Whether this process was told to leave (a fault hold ends early then, :mod:`lifeline.runtime._hold`)."""
    return _requested is not None


def _on_sigterm(signum: int, frame: Any) -> None:
    global _requested
    if _requested is None:
        _requested = time.monotonic()


class Preemption:
    """A trainer's preemption handling (see the module docstring).

    Args:
        grace: seconds from SIGTERM to SIGKILL (> 0).
        agree: exchange the flag at every step boundary (``checkpoint.every > 1``).
    """

    def __init__(self, grace: float, agree: bool) -> None:
        self.grace, self.agree = grace, agree
        self.agreements = 0
        self.agree_seconds = 0.0
        """Time spent in the agreement all-reduces, seconds (its per-step cost)."""

    @classmethod
    def install(cls, every: int, env: Mapping[str, str] | None = None) -> Preemption | None:
        """The handling of :data:`PREEMPT_ENV` with SIGTERM's handler installed; ``None`` when the variable
        is unset, not a number or not > 0, or when this is not the main thread (no handler can be set)."""
        env = os.environ if env is None else env
        try:
            grace = float(env.get(PREEMPT_ENV, "") or 0)
        except ValueError:
            return None
        if grace <= 0:
            return None
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread
            return None
        return cls(grace, agree=every > 1)

    def boundary(self, ctx: Any, checkpointer: Any, trainer: Any, step: int, *, saved: bool,
                 settle: Callable[[], None] | None = None) -> None:
        """The end of ``step`` (reported; saved when ``saved``): when this rank or, with :attr:`agree`, any
        rank was told to leave, make sure this rank's ``step`` is checkpointed; the rank told to leave then
        waits for its L1 copy and exits (see the module docstring).

        Raises:
            SystemExit: :data:`EXIT_PREEMPTED`, on the rank told to leave.
            Whatever a collective raises when a peer is gone (the loop recovers from it).
        """
        mine = _requested is not None
        anyone = self._agree(mine) if self.agree else mine
        if not anyone:
            return
        if settle is not None:
            settle()
        if not saved:
            t0 = time.perf_counter()
            receipt = checkpointer.save(step, trainer.state(), generation=ctx.generation)
            ctx.report("save", step=step, seconds=round(time.perf_counter() - t0, 6), preemption=True,
                       stall_seconds=getattr(receipt, "stall_seconds", None))
        if not mine:
            ctx.report("preempt_peer", record=False, step=step, saved_now=not saved)
            return
        tiers = self._await_l1(ctx, step)
        ctx.report("preempted", step=step, tiers=tiers, saved_now=not saved, grace_seconds=self.grace,
                   seconds=round(time.monotonic() - (_requested or time.monotonic()), 4),
                   agreements=self.agreements, agree_seconds=round(self.agree_seconds, 6))
        raise SystemExit(EXIT_PREEMPTED)

    def _agree(self, mine: bool) -> bool:
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.agreements += 1
        self.agree_seconds += time.perf_counter() - t0
        return bool(flag.item())

    def _await_l1(self, ctx: Any, step: int) -> list[str]:
        """Wait until the catalog records a peer's L1 copy of this rank's ``step`` (no peer replicas, no
        catalog: L0 only), at most until :data:`MARGIN_SECONDS` before the grace ends; the tiers reached."""
        catalog = getattr(ctx, "catalog", None)
        if catalog is None or _peer_replicas(ctx.settings) <= 0:
            return ["L0"]
        deadline = (_requested or time.monotonic()) + max(0.0, self.grace - MARGIN_SECONDS)
        tiers = {"L0"}
        while True:
            try:
                held = catalog.holders(step, ctx.rank)
            except Exception:  # noqa: BLE001 - the catalog away: try again until the deadline
                held = ()
            tiers |= {h.tier for h in held if h.tier == "L2" or (h.tier == "L1" and h.holder != ctx.rank)}
            if "L1" in tiers or time.monotonic() >= deadline:
                return sorted(tiers)
            time.sleep(POLL_SECONDS)


def _peer_replicas(settings: Any) -> int:
    """The job's L1 copies per shard: the settings' when they carry it, else ``LIFELINE_PEER_REPLICAS``
    (the sidecar's variable, which the trainer's container shares; default 1)."""
    found = getattr(settings, "peer_replicas", None)
    if found is not None:
        return int(found)
    try:
        return int(os.environ.get("LIFELINE_PEER_REPLICAS", "") or 1)
    except ValueError:
        return 1
