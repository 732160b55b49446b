"""Deterministic fault injection: a trainer holds at the step a fault of ``lifeline run`` is due.

``lifeline run --inject-failure trainer:rank=1:step=7`` must hit rank 1 at step 7, not at whichever
step the rank reached when the launcher's polling noticed step 7 (docs/launch.md, "Failure
injection"). The launcher gives each rank's trainer the steps at which a fault that targets it is due
(:data:`HOLD_ENV`, e.g. ``"7,15"``) and a directory (:data:`HOLD_DIR_ENV`); after a step's progress
report and its save (the step's checkpoint is handed to the sidecar exactly as without injection)
:func:`hold_at` creates ``hold-<step>`` there and waits until the launcher writes ``release-<step>``
(after it fired the fault), or until the fault kills or stops the process. File based: it works
while Redis is down. The launcher's side is :mod:`lifeline.launch._holds` (same names and files).

A hold never deadlocks: after :data:`HOLD_TIMEOUT_SECONDS` (``LIFELINE_FAULT_HOLD_TIMEOUT_SECONDS``)
the trainer goes on and prints a ``hold_timeout`` event (the launcher then fires the fault late, once
it sees a later step). A step holds once per job: the release file stays, so a re-run of the step
after a recovery (a rollback, a restart) goes through, and a process never holds a step twice.
Without :data:`HOLD_ENV` (every pod on Kubernetes) :func:`hold_at` does nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lifeline.runtime._preempt import requested as preempt_requested

__all__ = ["HOLD_ENV", "HOLD_DIR_ENV", "HOLD_TIMEOUT_ENV", "HOLD_TIMEOUT_SECONDS", "Hold", "hold_at",
           "hold_path", "release_path"]

HOLD_ENV = "LIFELINE_FAULT_HOLD"
"""Comma-separated steps at which this rank's trainer holds (a fault targeting it is due then)."""
HOLD_DIR_ENV = "LIFELINE_FAULT_HOLD_DIR"
"""The directory of this rank's ``hold-<step>`` and ``release-<step>`` files (the launcher's)."""
HOLD_TIMEOUT_ENV = "LIFELINE_FAULT_HOLD_TIMEOUT_SECONDS"
HOLD_TIMEOUT_SECONDS = 120.0
"""A hold ends after this long without a release (the launcher is gone or could not fire)."""
POLL_SECONDS = 0.01


def hold_path(directory: Path, step: int) -> Path:
    """The marker a trainer creates when it holds at ``step``."""
    return directory / f"hold-{step}"


def release_path(directory: Path, step: int) -> Path:
    """The file the launcher writes to release the hold at ``step`` (it stays: the step holds once)."""
    return directory / f"release-{step}"


def _touch(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``path`` whole (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(dict(doc)))
    os.replace(tmp, path)


class Hold:
    """The hold steps of one trainer process (see the module docstring).

    Args:
        steps: the steps to hold at.
        directory: where the ``hold-<step>`` and ``release-<step>`` files live.
        timeout: seconds a hold waits for its release at most.
    """

    def __init__(self, steps: frozenset[int], directory: Path, timeout: float = HOLD_TIMEOUT_SECONDS) -> None:
        self.steps, self.directory, self.timeout = steps, directory, timeout
        self.done: set[int] = set()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Hold | None:
        """The hold of :data:`HOLD_ENV` and :data:`HOLD_DIR_ENV`; ``None`` when either is unset or empty
        (a bad value is ignored too: fault injection must never stop a trainer)."""
        env = os.environ if env is None else env
        raw, directory = env.get(HOLD_ENV, "").strip(), env.get(HOLD_DIR_ENV, "").strip()
        if not raw or not directory:
            return None
        try:
            steps = frozenset(int(s) for s in raw.split(",") if s.strip())
            timeout = float(env.get(HOLD_TIMEOUT_ENV) or HOLD_TIMEOUT_SECONDS)
        except ValueError:
            return None
        return cls(steps, Path(directory), timeout) if steps else None

    def released(self, step: int) -> bool:
        return release_path(self.directory, step).exists()

    def at(self, ctx: Any, step: int, settle: Callable[[], None] | None = None) -> None:
        """Hold after ``step`` when it is a hold step not released yet (``ctx.report`` prints events;
        ``settle`` finishes an overlapped save first, so the step's copy is handed over before)."""
        if step not in self.steps or step in self.done:
            return
        self.done.add(step)
        if self.released(step):  # a re-run of the step after a recovery: the fault has fired
            return
        if settle is not None:
            settle()
        start = time.monotonic()
        marker = hold_path(self.directory, step)
        try:
            _touch(marker, {"pid": os.getpid(), "rank": getattr(ctx, "rank", None),
                            "generation": getattr(ctx, "generation", None), "time": round(time.time(), 4)})
        except OSError as err:
            ctx.report("hold_failed", record=False, step=step, error=f"{type(err).__name__}: {err}"[:300])
            return
        ctx.report("hold", record=False, step=step)
        deadline = start + self.timeout
        while not self.released(step):
            if preempt_requested():  # a preemption's SIGTERM ends the hold: the loop checkpoints and leaves
                break
            if time.monotonic() > deadline:
                try:  # the launcher falls back to the step reports: no late fire from the marker
                    marker.unlink()
                except OSError:
                    pass
                ctx.report("hold_timeout", record=False, step=step, seconds=round(self.timeout, 3))
                return
            time.sleep(POLL_SECONDS)
        ctx.report("held", record=False, step=step, seconds=round(time.monotonic() - start, 4))


_UNSET: Any = object()
_hold: Hold | None = _UNSET


def hold_at(ctx: Any, step: int, settle: Callable[[], None] | None = None) -> None:
    """:meth:`Hold.at` of this process's hold (read once from the environment); nothing without one.
    ``run_training`` calls it after every step's report and save."""
    global _hold
    if _hold is _UNSET:
        _hold = Hold.from_env()
    if _hold is not None:
        _hold.at(ctx, step, settle)
