"""``lifeline run``'s straggler watch: the ranks' compute times from their reports, judged each round by
:func:`lifeline.control.stragglers.detect_stragglers` (docs/stragglers.md).

Each trainer's step and save reports carry ``timings``, its compute seconds of its last steps
(:mod:`lifeline.runtime._stragglers`); the catalog keeps each rank's latest report only, and any one
of them brings the recent steps. Samples are kept per generation (a recovery starts them afresh: a
moved rank is judged on its new node). A rank flagged is reported once per generation: an event line
``straggler: rank R ...`` and an entry of the summary's ``stragglers``; with
``spec.recovery.straggler.action: replace`` its pod (trainer and sidecar) is stopped while the job runs,
so the engine replaces it as a lost pod: on another node, its node cooled down for
``nodeCooldownSeconds``, restoring its latest copy from a peer's L1 (the others from L0).
"""

from __future__ import annotations

import time
from typing import Any

from lifeline.api import StragglerSpec
from lifeline.catalog import CatalogView
from lifeline.control.stragglers import HISTORY_WINDOWS
from lifeline.control.stragglers import StragglerWatch as _Watch

__all__ = ["HISTORY_WINDOWS", "StragglerWatch"]


class StragglerWatch(_Watch):
    """The straggler state of one local run (see the module docstring): the sampling and judging of
    :class:`lifeline.control.stragglers.StragglerWatch`, plus the run's reporting and pod stopping.

    Args:
        spec: ``spec.recovery.straggler``.
    """

    def __init__(self, spec: StragglerSpec) -> None:
        super().__init__(spec)
        self.found: list[dict[str, Any]] = []

    def round(self, sup: Any, view: CatalogView) -> list[int]:
        """One supervision round: judge, report each rank newly flagged (``sup._event``) and, with
        ``action: replace`` while the job runs with no failure pending, stop its pod. Returns the ranks
        newly flagged."""
        self.layout = sup.layout
        verdict = self.observe(view, sup.layout.world_size)
        if verdict is None:
            return []
        new = self.flag(verdict)
        for score in new:
            pod = sup.pods.get(score.rank)
            node = getattr(pod, "node", None)
            act = (self.spec.action == "replace" and pod is not None and sup.snapshot.phase == "Running"
                   and sup._failing_since is None)
            entry = {**score.to_dict(), "generation": view.generation, "steps": [verdict.steps[0], verdict.steps[-1]],
                     "node": node, "at": round(time.time(), 4), "action": "replace" if act else "report"}
            self.found.append(entry)
            what = (f"stopping its pod on {node}: it moves to another node, {node} cooled down" if act
                    else "reported")
            sup._event(f"straggler: rank {score.rank} computes {score.relative:.2f}x the other ranks' median "
                       f"over steps {verdict.steps[0]}-{verdict.steps[-1]} (threshold {self.spec.threshold:g}; "
                       f"{score.individual:.2f}x its own best): {what}")
            if act:
                for role in ("trainer", "sidecar"):
                    pod.kill(role)
        return [s.rank for s in new]

    def summary(self) -> list[dict[str, Any]]:
        """The summary's ``stragglers``: one entry per rank flagged per generation (its scores, the steps
        judged, its node, when, and ``action``)."""
        return list(self.found)
