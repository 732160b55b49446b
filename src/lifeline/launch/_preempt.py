"""The launcher's side of a ``preempt`` injection (kinds in :mod:`lifeline.launch.inject`).

A preempted node's pods get SIGTERM and, ``terminationGracePeriodSeconds`` later, SIGKILL; then the
node is gone. :func:`preempt_env` turns preemption handling on in every rank's trainer (the trainer's
side is :mod:`lifeline.runtime._preempt`; the launcher may not import the runtime, so the variable's
name is repeated here and tests/launch/test_preempt.py checks they agree); :func:`preempt_pod` sends
the SIGTERM and waits for the trainer to leave. The caller (:meth:`lifeline.launch.faults.Faults._preempt`)
then SIGKILLs what is left and marks the node lost, so the engine plans once the trainer's copy is in L1.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Any

from lifeline.launch.inject import Injection

__all__ = ["PREEMPT_ENV", "preempt_env", "preempt_pod"]

PREEMPT_ENV = "LIFELINE_PREEMPT_GRACE_SECONDS"
"""The trainer's grace between SIGTERM and SIGKILL, seconds (:data:`lifeline.runtime._preempt.PREEMPT_ENV`)."""


def preempt_env(injections: Iterable[Injection]) -> dict[str, str]:
    """``{PREEMPT_ENV: grace}`` for every rank when a ``preempt`` injection is given (the largest grace:
    every rank agrees on the preemption at each step boundary, see :mod:`lifeline.runtime._preempt`);
    ``{}`` otherwise."""
    graces = [inj.grace_seconds for inj in injections if inj.kind == "preempt"]
    return {PREEMPT_ENV: f"{max(graces):g}"} if graces else {}


def preempt_pod(pod: Any, grace: float) -> str:
    """SIGTERM ``pod``'s trainer and wait until it exits, at most ``grace`` seconds (the supervisor's
    rounds pause meanwhile: no plan is made before the node goes). Returns a note for the fault's
    record: how the trainer ended and when. Never raises (a trainer already gone is noted)."""
    proc = getattr(pod, "trainer", None)
    if proc is None or proc.poll() is not None:
        return "the trainer had already exited: nothing to preempt"
    start = time.monotonic()
    try:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return f"trainer still running {grace:g} s after SIGTERM: killed"
    except OSError as err:
        return f"SIGTERM failed: {err}"
    return f"trainer exited {code} {time.monotonic() - start:.2f} s after SIGTERM (grace {grace:g} s)"
