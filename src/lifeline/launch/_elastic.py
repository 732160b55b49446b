"""Elastic resharding in ``lifeline run``: the pods a reshard drops, and lost nodes that come back.

A ``Reshard`` plan (shrink or grow, :mod:`lifeline.control.elastic`) keeps every pod of a rank
that exists in both layouts; their trainers adopt the new layout in their processes and read the
restore step from the sidecars' memory. A pod the new layout drops (``delete_ranks``) whose
sidecar is the source of some shard is kept, :class:`Retiring`, until the new generation trains;
its trainer exits by itself when it reads the plan. Other dropped pods stop at once.

:class:`NodeReturns` brings a lost local node back after ``--node-return-seconds`` (a repaired or
replaced node joining again), which is what lets the engine grow the job back to the spec's size.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping

from lifeline.api import RecoveryPlan
from lifeline.control import NodeState
from lifeline.launch._pods import Pod, stop_all

__all__ = ["NodeReturns", "Retiring"]


class Retiring:
    """Pods an elastic reshard dropped that still serve the restore step's bytes from their sidecars."""

    def __init__(self) -> None:
        self.pods: dict[int, Pod] = {}

    def take(self, plan: RecoveryPlan, pods: MutableMapping[int, Pod]) -> list[int]:
        """Move the plan's dropped ranks out of ``pods``: the ones whose sidecar is a source are kept
        here, the others stopped now. Returns the ranks kept."""
        holders = {s.holder for s in plan.sources if s.holder is not None}
        stop = []
        for rank in plan.delete_ranks:
            pod = pods.pop(rank, None)
            if pod is None:
                continue
            if rank in holders and pod.exit_code("sidecar") is None:
                self.pods[rank] = pod
            else:
                stop.append(pod)
        stop_all(stop, grace=0.5)
        return sorted(self.pods)

    def release(self) -> list[int]:
        """Stop every kept pod (the new generation trains: nothing reads from them any more)."""
        ranks = sorted(self.pods)
        stop_all(list(self.pods.values()), grace=0.5)
        self.pods.clear()
        return ranks


class NodeReturns:
    """Lost local nodes that become Ready again ``after`` seconds (``None``: never).

    Args:
        nodes: the run's nodes by name (shared with the fleet; updated in place).
        after: seconds a lost node stays lost.
    """

    def __init__(self, nodes: MutableMapping[str, NodeState], after: float | None) -> None:
        self.nodes, self.after = nodes, after
        self.lost: dict[str, float] = {}

    def lose(self, node: str, capacity: int = 1) -> None:
        """Mark ``node`` lost now."""
        self.nodes[node] = NodeState(node, ready=False, capacity=capacity)
        self.lost[node] = time.time()

    def due(self, now: float) -> list[str]:
        """Bring back (Ready, empty) every lost node whose time is up; returns their names."""
        if self.after is None:
            return []
        back = [n for n, t in self.lost.items() if now - t >= self.after]
        for node in back:
            old = self.nodes[node]
            self.nodes[node] = NodeState(node, ready=True, schedulable=old.schedulable, capacity=old.capacity)
            del self.lost[node]
        return back
