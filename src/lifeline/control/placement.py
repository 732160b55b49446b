"""Placement of L1 checkpoint replicas on peer sidecars (Gemini, Wang et al., SOSP 2023, §4).

Gemini places ``m`` copies of each machine's checkpoint (its own plus ``m - 1`` on other
machines). With ``N`` machines:

- **group placement** when ``m`` divides ``N``: machines form ``N / m`` groups of ``m``
  consecutive machines, and each machine's copies go to the other ``m - 1`` machines of its
  group. A group loses data only when all its ``m`` machines fail, which §4.1 shows is the
  placement that maximises the probability of recovering from CPU memory;
- **mixed placement** otherwise: the first ``floor(N / m) - 1`` groups use group placement and
  the last ``m + N mod m`` machines form a ring, each sending its copies to the next ``m - 1``
  machines of that ring.

Here a machine is a *node* and ``m = replicas + 1``. Several ranks may share a node: each
rank's ``replicas`` copies go to one rank on each of its node's peer nodes, choosing on each
peer node the rank that holds the fewest copies so far (ties: lowest rank), so the copies a
node receives are spread evenly over its ranks (loads differ by at most one).
"""

from __future__ import annotations

from collections.abc import Sequence

from lifeline.errors import ConfigError

__all__ = ["node_groups", "place_replicas"]


def node_groups(nodes: int, replicas: int) -> list[tuple[int, ...]]:
    """For each node index ``0..nodes-1``, the indices of its ``replicas`` peer nodes.

    Group placement when ``replicas + 1`` divides ``nodes``, else mixed (group + ring), per
    Gemini §4. Raises :class:`ConfigError` when ``nodes < replicas + 1``.
    """
    m = replicas + 1
    if replicas < 0:
        raise ConfigError(f"replicas must be >= 0, got {replicas}", field="checkpoint.peerReplicas")
    if nodes < m:
        raise ConfigError(
            f"{replicas} peer replicas need at least {m} distinct nodes, found {nodes}; lower "
            "spec.checkpoint.peerReplicas or spread the pods over more nodes",
            field="checkpoint.peerReplicas",
        )
    peers: list[tuple[int, ...]] = [()] * nodes
    if replicas == 0:
        return peers
    groups = nodes // m if nodes % m == 0 else nodes // m - 1
    for g in range(groups):
        members = list(range(g * m, (g + 1) * m))
        for i, node in enumerate(members):
            peers[node] = tuple(members[(i + k) % m] for k in range(1, m))
    ring = list(range(groups * m, nodes))
    if ring:
        size = len(ring)
        for i, node in enumerate(ring):
            peers[node] = tuple(ring[(i + k) % size] for k in range(1, m))
    return peers


def place_replicas(node_of_rank: Sequence[str], replicas: int) -> dict[int, tuple[int, ...]]:
    """For each rank, the ranks whose sidecars hold its L1 copies.

    Args:
        node_of_rank: node name of each rank (index = global rank). Nodes are numbered in the
            order they first appear, so rank 0's node is node 0.
        replicas: L1 copies per shard (``spec.checkpoint.peerReplicas``), >= 0.

    Returns:
        ``{rank: (holder, ...)}`` for every rank: ``replicas`` holder ranks, each on a distinct
        node other than the rank's own, ordered by peer distance. Deterministic.

    Raises:
        ConfigError: fewer distinct nodes than ``replicas + 1`` (``field="checkpoint.peerReplicas"``).
    """
    order: dict[str, int] = {}
    for node in node_of_rank:
        order.setdefault(node, len(order))
    ranks_on: list[list[int]] = [[] for _ in order]
    for rank, node in enumerate(node_of_rank):
        ranks_on[order[node]].append(rank)
    peers = node_groups(len(order), replicas)
    load = [0] * len(node_of_rank)
    out: dict[int, tuple[int, ...]] = {}
    for rank, node in enumerate(node_of_rank):
        holders = []
        for peer in peers[order[node]]:
            holder = min(ranks_on[peer], key=lambda r: (load[r], r))
            load[holder] += 1
            holders.append(holder)
        out[rank] = tuple(holders)
    return out
