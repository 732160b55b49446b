"""Verified recovery: a recomputed state is checked against the checksums recorded when it was first saved.

After a restore, a re-run or a localized replay, a rank recomputes steps it already trained once. For
every step it saved then, the catalog still holds the sealed :class:`~lifeline.checkpoint.ShardMetadata`
of that copy: the crc32c of every chunk and byte entry, computed by the sidecar when it sealed the
blob. :class:`RecoveryVerifier` takes those records when the recovery starts (before the re-saves
replace them) and, at the first recomputed step that has one, checksums the live state in the same
chunks (no copy: :func:`~lifeline.checkpoint.shard_buffers` views the tensors) and compares. Equal
proves the recovery bit-identical at that step (DESIGN.md invariant 1, checked at run time); a
difference is a :class:`~lifeline.errors.VerificationError`: the trainer stops with it, the engine's
next plan restores the verified copy or falls to the next rung (a failure during a localized replay
is never planned as another one), and the ``verify_failed`` event says which entries differed. A job
never ends Succeeded on a state a recovery got wrong without this check having had its chance.

MoEvement (arXiv 2412.15411) replays without such a check; this is Lifeline's own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from lifeline.checkpoint import PatternRules, ShardMetadata, plan_shard, shard_buffers
from lifeline.errors import CatalogError, LifelineError, VerificationError

__all__ = ["RecoveryVerifier", "PERTURB_ENV", "perturb_point"]

PERTURB_ENV = "LIFELINE_FAULT_PERTURB"
"""Fault injection for tests and the fuzzer: ``"<rank>:<step>"`` makes that rank's recomputation of
``step`` in generation 1 (the first recovery) come out different (one parameter element nudged), as a
non-deterministic kernel or a recovery bug would; the verified recovery must catch it."""


class RecoveryVerifier:
    """One rank's check of its recomputed state after a recovery (see the module docstring).

    Args:
        ctx: the rank's :class:`~lifeline.runtime.RuntimeContext` (``catalog``, ``layout``, ``rank``,
            ``job``, ``report``).
        rules: the model's pattern rules (the shard plan the sidecar sealed with).
    """

    def __init__(self, ctx: Any, rules: PatternRules | None) -> None:
        self.ctx, self.rules = ctx, rules
        self._recorded: dict[int, ShardMetadata] = {}
        self._restored: int | None = None
        self._how = ""

    @property
    def pending(self) -> tuple[int, ...]:
        """The recorded steps still to be checked, ascending (empty once the first one was)."""
        return tuple(sorted(self._recorded))

    def due(self, step: int) -> bool:
        """Whether :meth:`check` compares anything at ``step`` (a dict look-up: the loop asks every step)."""
        return step in self._recorded

    def arm(self, restored: int, *, how: str, not_before: int | None = None) -> None:
        """Take this rank's recorded checksums of the steps after ``restored`` (steps; the copy just
        restored was verified as it was read) from the catalog.

        Args:
            restored: the step the rank's state went back to.
            how: the recovery in words, for the events (``"restore"``, ``"window"``, ``"replay"``).
            not_before: the first step at which the state is whole again (a sparse window restored
                slot by slot is whole from its last slot on); earlier records are not compared.

        Never raises: without a catalog, or while Redis is away, there is nothing to check against.
        """
        self._recorded, self._restored, self._how = {}, restored, how
        catalog, rules = self.ctx.catalog, self.rules
        if catalog is None or rules is None:
            return
        first = max(restored + 1, not_before if not_before is not None else 0)
        try:
            steps = [s for s in catalog.steps() if s >= first]
            for step in steps:
                raw = catalog.meta(step, self.ctx.rank)
                if raw is None:
                    continue
                meta = ShardMetadata.from_json(raw)
                if meta.step == step and meta.rank == self.ctx.rank and meta.layout == self.ctx.layout:
                    self._recorded[step] = meta
                    break  # the first one is the one compared
        except (CatalogError, LifelineError, ValueError):
            self._recorded = {}

    def check(self, step: int, state: Mapping[str, Any]) -> None:
        """Compare ``state`` (the rank's state after ``step`` completed steps) with the record of
        ``step``, when there is one; after that first comparison nothing more is checked.

        Raises:
            VerificationError: the state differs from the copy recorded for ``step`` (names the
                entries, the restored step and the recovery).
        """
        meta = self._recorded.pop(step, None)
        if meta is None:
            return
        self._recorded = {}
        t0 = time.perf_counter()
        plan = plan_shard(state, self.ctx.layout, self.ctx.rank, self.rules)
        _, by_offset = shard_buffers(plan, state)
        bad = ["(blob size)"] if plan.nbytes != meta.nbytes else meta.mismatches(lambda off, n: by_offset.get(off, b""))
        seconds = round(time.perf_counter() - t0, 6)
        if not bad:
            self.ctx.report("verified", record=False, step=step, restored=self._restored, recovery=self._how,
                            seconds=seconds)
            return
        self.ctx.report("verify_failed", step=step, restored=self._restored, recovery=self._how,
                        entries=bad[:8], differing=len(bad), seconds=seconds)
        raise VerificationError(
            f"after the {self._how} of step {self._restored}, the recomputed state of step {step} differs from "
            f"the copy saved at step {step} before the failure in {len(bad)} entries ({', '.join(bad[:4])}"
            f"{', ...' if len(bad) > 4 else ''}): the recovery is not bit-identical; the next plan restores a "
            f"verified copy instead", job=self.ctx.job, rank=self.ctx.rank, step=step, key=bad[0])


def perturb_point(generation: int, rank: int, step: int, state: Any) -> bool:
    """Apply the :data:`PERTURB_ENV` fault when it names ``rank`` and ``step`` and ``generation`` is 1:
    the first floating-point tensor of ``state()`` (a callable returning the rank's state, called
    only then) gets ``+1.0`` in its first element, in place. Returns whether it fired."""
    if generation != 1 or os.environ.get(PERTURB_ENV, "") != f"{rank}:{step}":
        return False
    for value in state().values():
        if hasattr(value, "is_floating_point") and value.is_floating_point() and value.numel():
            value.view(-1)[0] += 1.0
            return True
    return False
