"""Replica placement for L1: ``lifeline.control.placement.place_replicas`` (Gemini, SOSP'23 §4)."""

from __future__ import annotations

from collections.abc import Sequence


def place(node_of_rank: Sequence[str], replicas: int) -> dict[int, tuple[int, ...]]:
    """For each rank, the ranks whose sidecars hold its L1 copies (all on distinct other nodes).

    Group placement when the group size divides the node count, otherwise mixed ring (see that module).
    Raises ``ConfigError`` when there are too few distinct nodes.
    """
    from lifeline.control.placement import place_replicas

    return {int(k): tuple(v) for k, v in place_replicas(list(node_of_rank), replicas).items()}
