"""A sidecar told to stop while its trainer is still there keeps serving until the trainer has left.

On Kubernetes every container of a deleted pod (preempted, evicted by ``kubectl drain``, replaced) gets
SIGTERM at the same moment, and SIGKILL ``terminationGracePeriodSeconds`` later. The operator's pod
runs the sidecar as an ordinary container, not as a native sidecar (an init container with
``restartPolicy: Always``, which the kubelet would stop only after the main containers): so the
ordering is the sidecar's own. With ``LIFELINE_PREEMPT_GRACE_SECONDS`` > 0 a trainer that gets SIGTERM
finishes its step, saves it and waits until a peer sidecar holds its L1 copy
(:mod:`lifeline.runtime._preempt`); that copy is sent by this sidecar. So on SIGTERM the sidecar
(:func:`lifeline.sidecar.server.run_sidecar`) first :func:`drain`\\ s: everything keeps running
(trainer socket, replication to the peers, the peer server, persistence, the catalog heartbeat) until
no trainer connection is open and nothing committed is waiting to be sealed or replicated, or until
:data:`MARGIN_SECONDS` before the grace ends; then it stops as before.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

__all__ = ["MARGIN_SECONDS", "POLL_SECONDS", "Drainable", "drain"]

log = logging.getLogger("lifeline.sidecar")

MARGIN_SECONDS = 0.5
"""The drain ends this long before the grace does: stopping (joining threads, closing the arena) takes a moment."""
POLL_SECONDS = 0.05


class Drainable(Protocol):
    """What :func:`drain` reads of the sidecar."""

    def trainer_connections(self) -> int:
        """Trainer connections open on the Unix socket."""
        ...

    def replication_idle(self) -> bool:
        """Nothing committed is waiting to be sealed or replicated."""
        ...


def drain(sc: Drainable, grace: float, *, since: float | None = None, margin: float = MARGIN_SECONDS) -> str:
    """Keep the sidecar serving after SIGTERM while its trainer may still need it; returns why it ended.

    Args:
        sc: the running sidecar.
        grace: seconds from SIGTERM to SIGKILL (the pod's ``terminationGracePeriodSeconds``); <= 0: no wait.
        since: when SIGTERM arrived (``time.monotonic``); default now.
        margin: the drain ends this many seconds before the grace does.

    Returns:
        ``"trainer gone"`` (no trainer connection open and replication idle: also when there was no
        trainer at all) or ``"grace"`` (the deadline passed first).
    """
    start = time.monotonic() if since is None else since
    deadline = start + max(0.0, grace - margin)
    first = True
    while True:
        trainers = sc.trainer_connections()
        if trainers == 0 and sc.replication_idle():
            why = "trainer gone"
            break
        if time.monotonic() >= deadline:
            why = "grace"
            break
        if first:
            log.info("sidecar draining: serving until its trainer left (at most %.1f s)", max(0.0, deadline - start),
                     extra={"event": "draining", "trainers": trainers, "grace_seconds": grace})
            first = False
        time.sleep(POLL_SECONDS)
    log.info("sidecar drained: %s", why, extra={"event": "drained", "why": why,
                                                 "seconds": round(time.monotonic() - start, 3)})
    return why
