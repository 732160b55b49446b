"""Elastic resharding, both ways: shrink when lost ranks find no room, grow back when room returns.

Both are the ``Reshard`` rung of DESIGN.md's ladder; only the data degree changes (every other
degree is fixed by the model: heads, experts, layers). A reshard keeps every pod of a rank that
exists in both layouts: its trainer adopts the new layout in its process and its sidecar keeps
what it holds, so the new layout reads the restore step's byte ranges from the sidecars' memory
(L0/L1) and L2 only for what memory lost (docs/control.md "Elastic resharding").

* :func:`plan_shrink` — when the lost ranks cannot all be placed on healthy nodes (no room outside
  cool-down): the largest data degree the healthy nodes hold, at least ``minReplicas`` ranks,
  restoring the latest step every shard of the old layout has a usable copy of in any tier (a
  dropped pod standing on a node a new pod needs is evicted at once and serves nothing).
* :func:`plan_grow` — when the job runs below the spec's size and the healthy, schedulable nodes
  outside cool-down have room for more replica groups: the largest data degree up to the spec's
  that fits, restoring the latest step every rank holds in memory. No failure starts it, so it
  counts no restart.

Both are pure: equal inputs give equal plans.
"""

from __future__ import annotations

from collections.abc import Sequence

from lifeline.api.recovery import TIERS, Failure, Holding, PodPlacement, RecoveryPlan, RestoreSource, Tier
from lifeline.api.trainingjob import LayoutSpec, RecoveryAction, TrainingJobSpec
from lifeline.control.state import JobState, NodeState

__all__ = ["plan_shrink", "plan_grow", "usable_holdings", "latest_covered", "with_nodes"]


def usable_holdings(state: JobState, gone: set[int]) -> dict[tuple[int, int], dict[Tier, Holding]]:
    """Holdings whose holder survives, as ``(step, rank) -> {tier: holding}`` (lowest holder wins)."""
    out: dict[tuple[int, int], dict[Tier, Holding]] = {}
    for h in sorted(state.holdings, key=lambda h: (h.step, h.rank, TIERS.index(h.tier), h.holder or 0)):
        if h.holder is not None and h.holder in gone:
            continue
        if h.tier == "L0" and h.holder != h.rank:
            continue
        out.setdefault((h.step, h.rank), {}).setdefault(h.tier, h)
    return out


def latest_covered(
    ranks: Sequence[int],
    usable: dict[tuple[int, int], dict[Tier, Holding]],
    tiers: Sequence[Tier],
    max_step: int,
) -> tuple[int | None, dict[int, RestoreSource]]:
    """The latest step <= ``max_step`` where every rank in ``ranks`` has a usable holding in
    ``tiers``, with the nearest-tier source of each; ``(None, {})`` when there is none."""
    steps = sorted({step for step, _ in usable if step <= max_step}, reverse=True)
    for step in steps:
        sources: dict[int, RestoreSource] = {}
        for rank in ranks:
            by_tier = usable.get((step, rank), {})
            tier = next((t for t in tiers if t in by_tier), None)
            if tier is None:
                break
            sources[rank] = RestoreSource(rank, tier, by_tier[tier].holder, None)
        else:
            return step, sources
    return None, {}


def with_nodes(sources: dict[int, RestoreSource], node_of_rank: Sequence[str]) -> tuple[RestoreSource, ...]:
    """Sources ascending by rank, each with its holder's node (``None`` for L2)."""
    return tuple(
        RestoreSource(s.rank, s.tier, s.holder, None if s.holder is None else node_of_rank[s.holder])
        for _, s in sorted(sources.items())
    )


def place(ranks: Sequence[int], staying: dict[int, str | None], state: JobState, avoid: set[str]
          ) -> dict[int, str | None]:
    """Put each of ``ranks`` on the least-loaded healthy node with room (ties: node name);
    ``None`` when no node has room. Load counts the pods that stay."""
    load: dict[str, int] = {}
    for node in staying.values():
        if node is not None:
            load[node] = load.get(node, 0) + 1
    candidates = [n for n in state.cluster.nodes if n.ready and n.schedulable and n.name not in avoid]
    out: dict[int, str | None] = {}
    for rank in ranks:
        free = [n for n in candidates if n.capacity is None or load.get(n.name, 0) < n.capacity]
        if not free:
            out[rank] = None
            continue
        best = min(free, key=lambda n: (load.get(n.name, 0), n.name))
        out[rank] = best.name
        load[best.name] = load.get(best.name, 0) + 1
    return out


def _healthy(state: JobState, avoid: set[str]) -> list[NodeState]:
    return [n for n in state.cluster.nodes if n.ready and n.schedulable and n.name not in avoid]


def _placement(state: JobState, new_world: int, lost: set[int], avoid: set[str]
               ) -> tuple[dict[int, str | None], dict[int, str | None], set[int]]:
    """Where the new layout's pods go: ``(kept, placed, evicted)``. Ranks below ``new_world`` that
    survived keep their pods; the others are placed on nodes with room, nodes holding no dropped
    pod first; a dropped pod on a node a new pod then needs is ``evicted`` (deleted at once, so its
    sidecar cannot serve the restore step: real nodes have no room for both)."""
    kept = {r: state.node_of_rank[r] for r in range(min(new_world, state.world_size)) if r not in lost}
    dropped = {r: state.node_of_rank[r] for r in range(new_world, state.world_size) if r not in lost}
    wanted = sorted(set(range(new_world)) - set(kept))
    placed = place(wanted, {**kept, **dropped}, state, avoid)
    rest = [r for r in wanted if placed[r] is None]
    evicted: set[int] = set()
    if rest:
        placed.update(place(rest, {**kept, **{r: n for r, n in placed.items() if n is not None}}, state, avoid))
        needed = {placed[r] for r in rest if placed[r] is not None}
        evicted = {r for r, node in dropped.items() if node in needed}
    return kept, placed, evicted


def _resharded(state: JobState, layout: LayoutSpec, step: int, sources: dict[int, RestoreSource],
               kept: dict[int, str | None], placed: dict[int, str | None], *, generation: int, restarts: int,
               cool_downs: tuple[tuple[str, float], ...], failures: tuple[Failure, ...], reason: str) -> RecoveryPlan:
    new_world = layout.world_size
    return RecoveryPlan(
        action=RecoveryAction.RESHARD,
        generation=generation,
        restarts=restarts,
        restore_step=step,
        layout=layout,
        node_of_rank=tuple(kept.get(r, placed.get(r)) for r in range(new_world)),
        restore_ranks=tuple(range(new_world)),
        sources=with_nodes(sources, state.node_of_rank),
        restart_ranks=tuple(sorted(kept)),
        create_pods=tuple(PodPlacement(r, placed[r]) for r in sorted(placed)),
        delete_ranks=tuple(range(new_world, state.world_size)),
        cool_downs=cool_downs,
        failures=failures,
        reason=reason,
    )


def plan_shrink(state: JobState, spec: TrainingJobSpec, lost: set[int], avoid: set[str], *, generation: int,
                restarts: int, cool_downs: tuple[tuple[str, float], ...], failures: tuple[Failure, ...],
                what: str) -> RecoveryPlan | None:
    """Shrink the data degree so the new world fits the healthy nodes' capacity; ``None`` if no
    smaller world >= ``spec.recovery.elastic.minReplicas`` fits, a healthy node's capacity is
    unlimited (the lost pods can be placed: no reshard needed), or no step covers every shard.

    The restore step is the latest one every shard of the old layout has a usable copy of: in the
    memory of a surviving sidecar (its own L0, a peer's L1; a sidecar whose rank the new layout
    drops still serves until the new generation trains) or in L2. Pods of ranks below the new world
    size that survived are kept (``restart_ranks``); lost ones are created on healthy nodes; ranks
    at or above it are deleted (``delete_ranks``) once nothing reads from them.
    """
    assert spec.recovery.elastic is not None
    layout = state.layout
    per_group = layout.tensor * layout.pipeline * layout.expert
    healthy = _healthy(state, avoid)
    if any(n.capacity is None for n in healthy):
        return None
    slots = sum(n.capacity or 0 for n in healthy)
    data = min(layout.data - 1, slots // per_group)
    if data < 1 or data * per_group < spec.recovery.elastic.min_replicas:
        return None
    new_layout = layout.model_copy(update={"data": data})
    kept, placed, evicted = _placement(state, new_layout.world_size, lost, avoid)
    step, sources = latest_covered(tuple(range(state.world_size)), usable_holdings(state, lost | evicted), TIERS,
                                   state.step)
    if step is None:
        return None
    memory = sum(s.tier != "L2" for s in sources.values())
    return _resharded(
        state, new_layout, step, sources, kept, placed, generation=generation, restarts=restarts,
        cool_downs=cool_downs, failures=failures,
        reason=(f"{what}; only {slots} pod slots on healthy nodes for world size {state.world_size}: resharding to "
                f"data degree {data} (world size {new_layout.world_size}, spec.recovery.elastic.minReplicas "
                f"{spec.recovery.elastic.min_replicas}) from step {step}, {memory} of {len(sources)} shards read "
                f"from sidecar memory"),
    )


def plan_grow(state: JobState, spec: TrainingJobSpec, *, now: float) -> RecoveryPlan | None:
    """Grow back toward the spec's data degree when healthy nodes have room again; ``None`` when the
    job already has the spec's size, elasticity is off, no node outside cool-down has room for one
    more replica group, or no step is held in memory by every rank.

    Counts the room as the job's own pods (each on its node) plus each healthy, schedulable node's
    free capacity outside the job's cool-downs; ``restarts`` is unchanged (nothing failed).
    """
    elastic, target, layout = spec.recovery.elastic, spec.layout, state.layout
    if elastic is None or layout.data >= target.data or (layout.tensor, layout.pipeline, layout.expert) != (
            target.tensor, target.pipeline, target.expert):
        return None
    avoid = set(state.cluster.cooling(now))
    per_group = layout.tensor * layout.pipeline * layout.expert
    load: dict[str, int] = {}
    for node in state.node_of_rank:
        load[node] = load.get(node, 0) + 1
    free = 0
    for n in _healthy(state, avoid):
        if n.capacity is None:
            free = per_group * target.data
            break
        free += max(0, n.capacity - load.get(n.name, 0))
    data = min(target.data, layout.data + free // per_group)
    if data <= layout.data:
        return None
    step, sources = latest_covered(tuple(range(state.world_size)), usable_holdings(state, set()), ("L0", "L1"),
                                   state.step)
    if step is None:
        return None
    new_layout = layout.model_copy(update={"data": data})
    kept, placed, _ = _placement(state, new_layout.world_size, set(), avoid)
    return _resharded(
        state, new_layout, step, sources, kept, placed, generation=state.generation + 1, restarts=state.restarts,
        cool_downs=tuple(sorted(state.cluster.cooling(now).items())), failures=(),
        reason=(f"room for {free} more pods on healthy nodes: growing from data degree {layout.data} to {data} "
                f"(world size {state.world_size} -> {new_layout.world_size}, the spec's is {target.world_size}) at "
                f"step {step}, read from sidecar memory"),
    )
