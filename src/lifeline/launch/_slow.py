"""The launcher's side of the ``slow`` fault: the variable that makes a rank's trainer slow on its node.

The trainer's side is :mod:`lifeline.runtime._stragglers` (the launcher may not import the runtime);
the name and the format are :data:`lifeline.launch.inject.SLOW_ENV`'s, and tests/launch/test_stragglers.py
checks that both sides agree.
"""

from __future__ import annotations

from collections.abc import Iterable

from lifeline.launch.inject import SLOW_ENV, Injection

__all__ = ["slow_env"]


def slow_env(injections: Iterable[Injection], rank: int, node: str) -> dict[str, str]:
    """``{SLOW_ENV: "S:F"}`` for the earliest ``slow`` fault that hits ``rank`` while it runs on its first
    node (``node-R``: the fault is a slow node, a replacement elsewhere runs at full speed); ``{}`` otherwise."""
    hits = sorted((inj.step, inj.slow_factor) for inj in injections if inj.kind == "slow" and inj.rank == rank)
    if not hits or node != f"node-{rank}":
        return {}
    step, factor = hits[0]
    return {SLOW_ENV: f"{step}:{factor:g}"}
