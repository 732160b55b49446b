"""What the launcher reads from the catalog each round, with the operator's own parsers.

Progress lines and holdings are parsed by :func:`lifeline.operator.observe.progress_of` and
:func:`~lifeline.operator.observe.holdings_of` (pure functions), so the launcher and the
operator see a job the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from lifeline.control import Holding
from lifeline.operator.observe import Progress, holdings_of, progress_of

__all__ = ["CatalogView", "read_catalog", "tier_steps", "plan_document", "seed_l2_holdings"]

RECENT_STEPS = 64
"""Holdings of at most this many of the newest catalog steps are read each round."""


@dataclass(frozen=True)
class CatalogView:
    """One read of the job's catalog.

    Attributes:
        generation: the catalog's current generation.
        progress: the trainers' latest reports (:class:`lifeline.operator.observe.Progress`).
        reports: rank -> the latest report (parsed JSON line).
        holdings: verified copies of the newest steps.
        registered: ranks with a live sidecar registration (the heartbeat).
        complete_step: the latest complete step (``None``: none yet).
        registered_nodes: rank -> the node its live registration names (a dead pod's registration
            lives until its TTL; a replacement on another node is not registered by it).
    """

    generation: int
    progress: Progress
    reports: Mapping[int, dict] = field(default_factory=dict)
    holdings: frozenset[Holding] = frozenset()
    registered: frozenset[int] = frozenset()
    complete_step: int | None = None
    registered_nodes: Mapping[int, str] = field(default_factory=dict)


def read_catalog(catalog, world_size: int) -> CatalogView:
    """Read generation, progress, registrations and holdings (a few pipelined Redis calls).

    Raises:
        CatalogError: Redis is unreachable.
    """
    generation = catalog.generation()
    raw = catalog._call(catalog.r.hgetall, catalog.prefix + "progress")
    reports = {}
    for rank, line in raw.items():
        try:
            reports[int(rank)] = json.loads(line)
        except (ValueError, TypeError):
            continue
    steps = catalog.steps()[-RECENT_STEPS:]
    pipe = catalog.r.pipeline(transaction=False)
    keys = [(s, r) for s in steps for r in range(world_size)]
    for s, r in keys:
        pipe.smembers(f"{catalog.prefix}holders:{s}:{r}")
    members = catalog._call(pipe.execute) if keys else []
    sidecars = catalog.sidecars()
    return CatalogView(
        generation=generation,
        progress=progress_of(raw, generation),
        reports=reports,
        holdings=holdings_of(dict(zip(keys, members)), world_size),
        registered=frozenset(sidecars),
        complete_step=catalog.latest_complete_step(),
        registered_nodes={r: str(info.get("node", "")) for r, info in sidecars.items()},
    )


def tier_steps(holdings: frozenset[Holding], world_size: int) -> dict[str, int | None]:
    """Per tier, the latest step every rank's shard has a copy at: ``{"L0": s, "L1": s, "L2": s}``."""
    by: dict[tuple[str, int], set[int]] = {}
    for h in holdings:
        by.setdefault((h.tier, h.step), set()).add(h.rank)
    out: dict[str, int | None] = {}
    for tier in ("L0", "L1", "L2"):
        full = [s for (t, s), ranks in by.items() if t == tier and len(ranks) == world_size]
        out[tier] = max(full) if full else None
    return out


def plan_document(plan) -> dict:
    """The catalog's ``plan:<generation>`` document of a control ``RecoveryPlan``: its JSON plus
    ``restore_step``/``replay_to_step`` in snake_case (what ``lifeline.runtime`` reads), exactly
    as the operator publishes it."""
    doc = json.loads(plan.to_json())
    doc["restore_step"] = plan.restore_step
    doc["replay_to_step"] = plan.replay_to_step
    return doc


def seed_l2_holdings(catalog, manifest) -> None:
    """Record an L2 checkpoint found in storage in a fresh catalog: for every rank of the saved
    layout, its shard metadata (rebuilt from the manifest's chunks and byte entries) and an
    ``L2`` holding, as the sidecar that committed it had recorded them."""
    from lifeline.checkpoint import ShardMetadata, TensorMeta

    for rank in range(manifest.layout.world_size):
        tensors = tuple(
            TensorMeta(fqn, rec.dtype, tuple(rec.shape), dict(rec.pattern),
                       tuple(ref.chunk for ref in rec.chunks if ref.rank == rank))
            for fqn, rec in sorted(manifest.tensors.items())
            if any(ref.rank == rank for ref in rec.chunks)
        )
        meta = ShardMetadata(job=manifest.job, step=manifest.step, rank=rank, layout=manifest.layout,
                             nbytes=manifest.blobs[rank], tensors=tensors,
                             bytes_entries=tuple(manifest.bytes_entries.get(rank, {}).values()))
        catalog.add_holding(manifest.step, rank, "L2", meta.to_json())
