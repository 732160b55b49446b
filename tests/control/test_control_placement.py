"""place_replicas(): Gemini group / mixed placement of L1 copies."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lifeline.control import node_groups, place_replicas
from lifeline.errors import ConfigError


def test_group_placement_when_the_copy_count_divides_the_nodes():
    # 6 nodes, 2 peer replicas -> m = 3 divides 6: groups {0,1,2} and {3,4,5}
    assert node_groups(6, 2) == [(1, 2), (2, 0), (0, 1), (4, 5), (5, 3), (3, 4)]


def test_mixed_placement_otherwise():
    # 7 nodes, m = 3: floor(7/3) - 1 = 1 group {0,1,2}, then a ring of 3 + 7 mod 3 = 4 nodes {3,4,5,6}
    assert node_groups(7, 2) == [(1, 2), (2, 0), (0, 1), (4, 5), (5, 6), (6, 3), (3, 4)]
    # 3 nodes, m = 2: no group, one ring of 3
    assert node_groups(3, 1) == [(1,), (2,), (0,)]


def test_ranks_sharing_nodes_spread_their_copies():
    placement = place_replicas(["a", "a", "b", "b"], 1)
    assert placement == {0: (2,), 1: (3,), 2: (0,), 3: (1,)}


def test_no_replicas():
    assert place_replicas(["a", "a"], 0) == {0: (), 1: ()}


def test_too_few_nodes_is_a_config_error():
    with pytest.raises(ConfigError, match="at least 3 distinct nodes, found 2") as info:
        place_replicas(["a", "b", "a", "b"], 2)
    assert info.value.field == "checkpoint.peerReplicas"


@settings(max_examples=300, deadline=None)
@given(
    node_of_rank=st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=40),
    replicas=st.integers(0, 4),
)
def test_properties(node_of_rank, replicas):
    nodes = list(dict.fromkeys(node_of_rank))
    if len(nodes) < replicas + 1:
        with pytest.raises(ConfigError):
            place_replicas(node_of_rank, replicas)
        return
    placement = place_replicas(node_of_rank, replicas)
    assert sorted(placement) == list(range(len(node_of_rank)))
    copies = Counter()
    senders: dict[str, set[str]] = {n: set() for n in nodes}
    for rank, holders in placement.items():
        assert len(holders) == replicas
        holder_nodes = [node_of_rank[h] for h in holders]
        assert len(set(holder_nodes)) == replicas, "copies on distinct nodes"
        assert node_of_rank[rank] not in holder_nodes, "never on the rank's own node"
        for h in holders:
            copies[h] += 1
            senders[node_of_rank[h]].add(node_of_rank[rank])
    # balance: every node receives copies from exactly `replicas` nodes (Gemini's groups and rings),
    for node in nodes:
        assert len(senders[node]) == replicas
    # and spreads what it receives evenly over its ranks
    for node in nodes:
        loads = [copies[r] for r, n in enumerate(node_of_rank) if n == node]
        assert max(loads) - min(loads) <= 1
    # group placement: when m divides the node count, peers are closed groups of m nodes
    m = replicas + 1
    if len(nodes) % m == 0 and replicas:
        peers = node_groups(len(nodes), replicas)
        for i, group in enumerate(peers):
            assert all(set(peers[j]) | {j} == set(group) | {i} for j in group)
    assert place_replicas(node_of_rank, replicas) == placement  # deterministic
