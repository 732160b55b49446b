"""A run that finds its job in the L2 store resumes from it; a finished run digests its final state."""

from __future__ import annotations

from typing import Any

from lifeline.api.recovery import RecoveryPlan
from lifeline.api.trainingjob import LayoutSpec, RecoveryAction
from lifeline.catalog import Catalog
from lifeline.checkpoint import Storage, consolidate, list_steps, read_manifest
from lifeline.launch._observe import seed_l2_holdings
from lifeline.launch.summary import await_l2_step, await_metas, checksum_digest, state_digest

__all__ = ["resume_plan", "final_digest"]


def resume_plan(catalog: Catalog, storage: Storage, prefix: str, job: str, layout: LayoutSpec, *,
                generation: int = 1, restarts: int = 0) -> RecoveryPlan | None:
    """A plan restoring the latest L2 checkpoint of ``job`` into ``layout`` (resharded when it was
    saved in another), after recording its holdings in the (fresh) catalog; ``None`` when the store
    holds no checkpoint of the job."""
    steps = list_steps(storage, prefix, job)
    if not steps:
        return None
    manifest = read_manifest(storage, prefix, job, max(steps))
    seed_l2_holdings(catalog, manifest)
    saved = LayoutSpec(**manifest.layout.to_dict())
    action = RecoveryAction.ROLLBACK if saved == layout else RecoveryAction.RESHARD
    how = "restoring it" if action is RecoveryAction.ROLLBACK else f"resharding it to layout {layout.to_wire()}"
    plan = RecoveryPlan.restore_all(
        generation, manifest.step, layout, action=action, saved=saved, restarts=restarts,
        reason=f"the L2 store holds step {manifest.step} of {job} in layout {saved.to_wire()}; {how}")
    return plan


def final_digest(catalog: Catalog, found: tuple[Storage, str] | None, job: str, step: int,
                 persist_every: int | None) -> dict[str, Any]:
    """Digest of the final checkpoint: of the consolidated L2 state when ``step`` is persisted
    (awaited up to 120 s), else of the catalog's chunk checksums (every rank's filing awaited up to
    60 s: the sidecars file the final save a moment after the trainers finished)."""
    if found is not None and persist_every and step % persist_every == 0:
        storage, prefix = found
        if await_l2_step(storage, prefix, job, step, 120.0):
            return {"sha256": state_digest(consolidate(storage, prefix, job, step)), "source": "L2", "step": step}
    return {"sha256": checksum_digest(await_metas(catalog, step, 60.0)), "source": "checksums", "step": step}
