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
from lifeline.control.state import stage_of
from lifeline.control.stragglers import StragglerVerdict, detect_stragglers, samples_of

__all__ = ["StragglerWatch"]

HISTORY_WINDOWS = 4
"""Steps of samples kept per rank: this many windows (the individual score's history)."""


class StragglerWatch:
    """The straggler state of one local run (see the module docstring).

    Args:
        spec: ``spec.recovery.straggler``.
    """

    def __init__(self, spec: StragglerSpec) -> None:
        self.spec = spec
        self.samples: dict[int, dict[int, float]] = {}
        self.generation: int | None = None
        self.flagged: set[int] = set()
        self.found: list[dict[str, Any]] = []
        self.last: StragglerVerdict | None = None
        self.layout: Any = None
        self._judged_through = 0

    def observe(self, view: CatalogView, world_size: int) -> StragglerVerdict | None:
        """Take this round's reports in; the verdict when a newer step could be judged, else ``None``."""
        if view.generation != self.generation:
            self.samples, self.flagged, self.generation, self._judged_through = {}, set(), view.generation, 0
        keep = HISTORY_WINDOWS * self.spec.window
        for rank, new in samples_of(view.reports.values(), view.generation, world_size).items():
            mine = self.samples.setdefault(rank, {})
            mine.update(new)
            for step in sorted(mine)[:-keep]:
                del mine[step]
        verdict = detect_stragglers(self.samples, threshold=self.spec.threshold, window=self.spec.window,
                                    group_of=self.group_of(world_size))
        if not verdict.steps or verdict.steps[-1] <= self._judged_through:
            return None
        self._judged_through = verdict.steps[-1]
        self.last = verdict
        return verdict

    def group_of(self, world_size: int) -> dict[int, int]:
        """rank → its pipeline stage in the current layout (stages differ in work: compared within one)."""
        return {r: stage_of(r, self.layout) for r in range(world_size)} if self.layout is not None else {}

    def round(self, sup: Any, view: CatalogView) -> list[int]:
        """One supervision round: judge, report each rank newly flagged (``sup._event``) and, with
        ``action: replace`` while the job runs with no failure pending, stop its pod. Returns the ranks
        newly flagged."""
        self.layout = sup.layout
        verdict = self.observe(view, sup.layout.world_size)
        if verdict is None:
            return []
        new = [s for s in verdict.scores if s.straggler and s.rank not in self.flagged]
        for score in new:
            self.flagged.add(score.rank)
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
