"""The launcher's side of deterministic injection: where a rank's trainer holds, and its release.

The trainer's side is :mod:`lifeline.runtime._hold` (the launcher may not import the runtime: the
parts table of DESIGN.md); both follow this protocol, and tests/launch/test_chaos_units.py checks
that they agree. For rank ``r`` the launcher sets :data:`HOLD_ENV` to the steps of the faults that hit
``r`` (:func:`lifeline.launch.inject.hold_steps`) and :data:`HOLD_DIR_ENV` to :func:`hold_dir`; the
trainer creates ``hold-<step>`` there after the step's report and save, and waits for
``release-<step>``, which :func:`release` writes once the fault fired.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from lifeline.launch.inject import Injection, due, hold_steps

__all__ = ["HOLD_ENV", "HOLD_DIR_ENV", "hold_dir", "hold_env", "hold_path", "release_path", "release", "fire_due"]

HOLD_ENV = "LIFELINE_FAULT_HOLD"
"""Comma-separated steps at which the rank's trainer holds (``"7,15"``)."""
HOLD_DIR_ENV = "LIFELINE_FAULT_HOLD_DIR"
"""The directory of the rank's ``hold-<step>`` and ``release-<step>`` files."""


def hold_dir(state_dir: Path, rank: int) -> Path:
    """``STATE/holds/rank-R``: in the run's state dir, so that it outlives the rank's pods (a
    replacement does not hold again at a step whose fault fired)."""
    return state_dir / "holds" / f"rank-{rank}"


def hold_env(injections: Iterable[Injection], rank: int, state_dir: Path) -> dict[str, str]:
    """The variables that make ``rank``'s trainer hold at its faults' steps (none without such faults), and
    with a ``preempt`` fault those that turn preemption handling on (every rank: :mod:`lifeline.launch._preempt`)."""
    from lifeline.launch._preempt import preempt_env

    injections = tuple(injections)
    steps = hold_steps(injections, rank)
    if not steps:
        return preempt_env(injections)
    return {HOLD_ENV: ",".join(str(s) for s in steps), HOLD_DIR_ENV: str(hold_dir(state_dir, rank)),
            **preempt_env(injections)}


def hold_path(directory: Path, step: int) -> Path:
    """The marker a trainer creates when it holds at ``step``."""
    return directory / f"hold-{step}"


def release_path(directory: Path, step: int) -> Path:
    """The file that releases the hold at ``step`` (it stays for the run: the step holds once)."""
    return directory / f"release-{step}"


def release(directory: Path, step: int) -> None:
    """Release the hold at ``step``: write ``release-<step>`` whole, remove ``hold-<step>``. Idempotent.

    Raises:
        OSError: the directory cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = release_path(directory, step)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"time": round(time.time(), 4)}))
    os.replace(tmp, path)
    try:
        hold_path(directory, step).unlink()
    except FileNotFoundError:
        pass


def fire_due(faults: Any, pending: list[Injection], reached: dict[int, int], *, recovering: bool,
             hold_dir: Callable[[int], Path] | None, event: Callable[[str], None], last_step: int | None = None,
             finished: Collection[int] = (), world_size: int = 0) -> list[Any]:
    """One supervision round of injection: fire (``faults.fire``) the injections of ``pending`` that are
    due — those whose trainer holds at their step (its ``hold-<step>`` file exists under
    ``hold_dir(rank)``), and the fallback and ``when=recovery`` ones on the ``reached`` steps
    (:func:`lifeline.launch.inject.due`) — then release the holds of the whole group, so a trainer a
    fault left alive goes on and a re-run of the step after a recovery does not hold again. Each firing
    is told to ``event``. Returns the :class:`~lifeline.launch.faults.FiredFault` records, in order.
    ``pending`` loses the fired injections (in place).

    An injection at ``last_step`` (the job's last step: a late failure, :data:`~lifeline.launch.inject.LATE_KINDS`)
    counts as held only once every other rank below ``world_size`` is in ``finished`` (its latest report is
    ``done``): the fault lands after they finished, whatever the timing."""
    held = set() if hold_dir is None else {
        (inj.rank, inj.step) for inj in pending if inj.holds and hold_path(hold_dir(inj.rank), inj.step).exists()}
    if last_step is not None:
        held = {(rank, step) for rank, step in held
                if step != last_step or set(range(world_size)) - {rank} <= set(finished)}
    fired_now = due(pending, reached, recovering=recovering, held=held)
    out = []
    for inj in fired_now:
        holding = (inj.rank, inj.step) in held
        fired = faults.fire(inj, step=inj.step if holding else None)
        event(f"injecting {inj} (at step {fired.step}{', held' if holding else ''})"
              + (f": {fired.note}" if fired.note else ""))
        out.append(fired)
    for inj in fired_now:
        if inj.holds and hold_dir is not None:
            try:
                release(hold_dir(inj.rank), inj.step)
            except OSError as err:
                event(f"could not release the hold of {inj}: {err}")
    return out
