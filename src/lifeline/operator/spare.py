"""Sparing a plan's step in the sidecars' memory from the operator (docs/control.md, "Elastic resharding").

A plan that restores a shard from L0/L1 (:attr:`lifeline.api.recovery.RecoveryPlan.reads_memory`) is
published only once its step is spared (:meth:`lifeline.catalog.Catalog.spare`): saves sealed after the
catalog read it was made from may otherwise evict the copy it names (fuzz seed 3085). The spare is dropped
once the new generation trains, or lapses by its TTL.
"""

from __future__ import annotations

import logging

from lifeline.api.recovery import RecoveryPlan
from lifeline.catalog import Catalog
from lifeline.errors import CatalogError

__all__ = ["spare", "unspare"]

log = logging.getLogger("lifeline.operator")


def spare(catalog: Catalog, plan: RecoveryPlan, ttl_seconds: float) -> bool:
    """``Catalog.spare`` for ``ttl_seconds``; ``False`` (no plan this resync) when a copy the plan names was
    evicted meanwhile or Redis does not answer."""
    try:
        return catalog.spare(plan, ttl_seconds=ttl_seconds)
    except CatalogError as err:
        log.warning("cannot spare step %s for the plan: %s", plan.restore_step, err)
        return False


def unspare(catalog: Catalog) -> None:
    """``Catalog.unspare``, best effort: the spare lapses by its TTL when Redis does not answer."""
    try:
        catalog.unspare()
    except CatalogError as err:
        log.warning("cannot drop the plan's spare (it lapses by its TTL): %s", err)
