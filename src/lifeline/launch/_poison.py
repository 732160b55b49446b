"""The launcher's side of the ``nan`` fault: the variable that tells a rank's trainer which batches to poison.

The trainer's side is :mod:`lifeline.runtime._numerics` (the launcher may not import the runtime); the
name and the format are :data:`lifeline.launch.inject.NAN_ENV`'s, and tests/runtime/test_numerics.py
checks that both sides agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lifeline.launch._holds import HOLD_DIR_ENV, hold_dir
from lifeline.launch.inject import NAN_ENV, Injection

__all__ = ["nan_env"]


def nan_env(injections: Iterable[Injection], rank: int, state_dir: Path) -> dict[str, str]:
    """``{NAN_ENV: "S[:transient],...", HOLD_DIR_ENV: STATE/holds/rank-R}`` for the ``nan`` faults that hit
    ``rank`` (steps sorted; a transient one marks ``nan-S`` there once it fired, so it fires once per run);
    ``{}`` without any."""
    hits = sorted((inj.step, inj.transient) for inj in injections if inj.kind == "nan" and inj.rank == rank)
    if not hits:
        return {}
    return {NAN_ENV: ",".join(f"{step}:transient" if transient else str(step) for step, transient in hits),
            HOLD_DIR_ENV: str(hold_dir(state_dir, rank))}
