"""What a reader sees after a kill: committed steps verify and equal what was saved; nothing partial shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lifeline.bench._crash_state import bit_identical
from lifeline.checkpoint import (
    Storage,
    consolidate,
    delete_step,
    list_steps,
    read_manifest,
    verify_checkpoint,
)
from lifeline.errors import LifelineError, ManifestError


@dataclass
class Counts:
    """Per-target tallies (steps are checkpoint steps; every count is a number of trials or steps).

    ``torn_visible`` counts steps a reader saw as committed (listed, or a manifest readable by key)
    that failed :func:`verify_checkpoint`, did not consolidate bit-identical to the state saved, or
    that no save had committed; it must be 0. ``committed_lost`` counts committed steps that later
    vanished without the bench deleting them (must be 0 too).
    """

    trials: int = 0
    killed_before_commit: int = 0
    killed_after_commit: int = 0
    committed_and_valid: int = 0
    torn_visible: int = 0
    committed_lost: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def torn(self, what: str) -> None:
        self.torn_visible += 1
        if len(self.problems) < 20:
            self.problems.append(what)


class Reader:
    """Checks one job's checkpoints in ``storage`` under ``prefix`` after every kill.

    Args:
        expected: ``seed -> full state``; the bench records the seed of every attempt per step.
        keep: newest committed steps kept; older ones are deleted (retention, as a trainer's GC would).
    """

    def __init__(self, storage: Storage, prefix: str, job: str, expected: Callable[[int], dict], counts: Counts,
                 *, keep: int = 3) -> None:
        self.storage, self.prefix, self.job, self.expected, self.counts = storage, prefix, job, expected, counts
        self.keep = keep
        self.known: dict[int, int] = {}  # committed step -> seed, checked once
        self.deleted: set[int] = set()  # steps removed by retention

    def check(self, attempts: dict[int, int], killed_step: int | None = None) -> bool:
        """Check what is visible now; ``attempts`` maps each step saved so far to the seed of its
        latest attempt. Returns whether ``killed_step`` is committed (visible)."""
        c = self.counts
        steps = list_steps(self.storage, self.prefix, self.job)
        if killed_step is not None and killed_step not in steps:
            try:  # a reader going by key sees the step if its manifest is there (it may have landed just now)
                read_manifest(self.storage, self.prefix, self.job, killed_step)
            except ManifestError:
                pass
            else:
                steps = sorted({*steps, killed_step})
        for gone in sorted(set(self.known) - set(steps)):
            c.committed_lost += 1
            c.problems.append(f"committed step {gone} vanished")
            del self.known[gone]
        for step in steps:
            if step in self.known:
                continue
            seed = attempts.get(step)
            if seed is None:
                c.torn(f"step {step} listed but never saved")
                self.known[step] = -1
                continue
            try:
                verify_checkpoint(self.storage, self.prefix, self.job, step)
                ok = bit_identical(consolidate(self.storage, self.prefix, self.job, step), self.expected(seed))
            except LifelineError as err:
                ok, why = False, str(err)
            else:
                why = "consolidated state differs from the state saved"
            if ok:
                c.committed_and_valid += 1
            else:
                c.torn(f"step {step}: {why}"[:400])
            self.known[step] = seed
        visible = killed_step in steps
        for old in sorted(self.known)[: -self.keep]:
            delete_step(self.storage, self.prefix, self.job, old)
            self.deleted.add(old)
            del self.known[old]
        return visible

    def final(self) -> None:
        """Re-verify every kept step once more at the end (a late write must not have torn it)."""
        for step, seed in sorted(self.known.items()):
            if seed < 0:
                continue
            try:
                verify_checkpoint(self.storage, self.prefix, self.job, step)
                ok = bit_identical(consolidate(self.storage, self.prefix, self.job, step), self.expected(seed))
            except LifelineError as err:
                self.counts.torn(f"step {step} at the end: {err}"[:400])
                continue
            if not ok:
                self.counts.torn(f"step {step} at the end: consolidated state differs")
