"""What ``lifeline run`` observes each round, as control's :class:`~lifeline.control.Observed` (pure).

The launcher's processes stand in for containers: an exited process is a container termination
(a signal is reported as the kubelet does, 128 + signal), a "node" marked lost is a node whose
Ready condition is False, and a live sidecar process is a running sidecar container. Everything
the catalog says comes through :class:`lifeline.control.CatalogFacts`, exactly as for the operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from lifeline.api.recovery import Holding
from lifeline.catalog import Catalog, CatalogView
from lifeline.checkpoint import Manifest, ShardMetadata, TensorMeta
from lifeline.control import (
    CatalogFacts,
    ClusterState,
    ContainerTerminated,
    NodeCondition,
    NodeState,
    Observed,
    SidecarState,
    Signal,
)

__all__ = ["MIN_SETTLE_SECONDS", "PodView", "observed_of", "quiet", "tier_steps", "seed_l2_holdings"]

MIN_SETTLE_SECONDS = 0.05
"""The job counts as quiet (planning need not wait :data:`lifeline.control.SETTLE_SECONDS`) no sooner
than this after the first failure signal, and then only when every live trainer has reported a
collective failure in the current generation (it is blocked, it saves nothing more) and the
catalog's holdings did not change between two rounds (the last seals are filed)."""


class PodView(Protocol):
    """What :func:`observed_of` reads of a rank's local pod (:class:`lifeline.launch._pods.Pod`)."""

    @property
    def node(self) -> str: ...

    @property
    def handled(self) -> set[str]: ...

    @property
    def sidecar_started_at(self) -> float | None: ...

    @property
    def registered_at(self) -> float | None: ...

    @property
    def trainer_started_at(self) -> float | None: ...

    def exit_code(self, role: str) -> int | None: ...


def observed_of(pods: Mapping[int, PodView], nodes: Mapping[str, NodeState], view: CatalogView,
                world_size: int) -> Observed:
    """The round's :class:`~lifeline.control.Observed` from the local pods, nodes and one catalog read.

    Args:
        pods: the current pod of each rank.
        nodes: every local node by name (a node injected as lost is not ready).
        view: this round's :meth:`lifeline.catalog.Catalog.view`.
        world_size: ranks of the current layout.
    """
    finished = all(p.exit_code("trainer") == 0 for p in pods.values())
    signals: list[Signal] = []
    sidecars: list[SidecarState] = []
    ready = set()
    for rank, pod in sorted(pods.items()):
        for role in ("trainer", "sidecar"):
            code = pod.exit_code(role)
            if code is None or role in pod.handled:
                continue
            if code == 0 and (role == "trainer" or finished):
                continue  # a finished trainer, or a sidecar stopping after the job
            exit_code = 128 - code if code < 0 else code  # as the kubelet reports a signal: 137 = SIGKILL
            signals.append(ContainerTerminated(rank, pod.node, role, exit_code, "Killed" if code < 0 else "Error"))
        sidecar_alive = pod.exit_code("sidecar") is None
        if sidecar_alive and pod.sidecar_started_at is not None:
            sidecars.append(SidecarState(rank, pod.node, pod.sidecar_started_at, pod.registered_at))
        reg = view.registrations.get(rank)
        if sidecar_alive and pod.exit_code("trainer") is None and reg is not None and reg.node == pod.node:
            ready.add(rank)
    used = {p.node for p in pods.values()}
    signals += [NodeCondition(n, False) for n in sorted(used) if not nodes[n].ready]
    return Observed(
        node_of_rank=tuple(pods[r].node if r in pods else None for r in range(world_size)),
        cluster=ClusterState(nodes=tuple(nodes[n] for n in sorted(nodes))),
        signals=tuple(signals),
        sidecars=tuple(sidecars),
        ready=frozenset(ready),
        finished=finished,
        catalog=CatalogFacts.of(view),
        restarts_trainers=True,  # the supervisor kills a frozen trainer the plan restarts (a HANG)
        # when each running trainer process started (by a plan or as a straggler): whether its words are its own
        trainer_started={rank: pod.trainer_started_at for rank, pod in pods.items()
                         if pod.trainer_started_at is not None and pod.exit_code("trainer") is None},
    )


def quiet(view: CatalogView, last_holdings: frozenset[Holding] | None, pods: Mapping[int, PodView],
          failing_since: float | None, now: float) -> bool:
    """Whether the job is quiet enough to plan on (see :data:`MIN_SETTLE_SECONDS`)."""
    if failing_since is None or now - failing_since < MIN_SETTLE_SECONDS or view.holdings != last_holdings:
        return False
    blocked = {r.rank for r in view.reports.values() if r.event == "failure" and r.generation == view.generation}
    return {rank for rank, pod in pods.items() if pod.exit_code("trainer") is None} <= blocked


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


def seed_l2_holdings(catalog: Catalog, manifest: Manifest) -> None:
    """Record an L2 checkpoint found in storage in a fresh catalog: for every rank of the saved
    layout, its shard metadata (rebuilt from the manifest's chunks and byte entries) and an
    ``L2`` holding, as the sidecar that committed it had recorded them."""
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
        catalog.add_holding(manifest.step, rank, "L2", None, meta.to_json())
