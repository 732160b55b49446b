"""observe() reading a real Redis catalog: the latest L2 checkpoint stays visible however many
memory-tier steps came after it (an elastic reshard restores from it). The Kubernetes side is a
unit-test double returning empty lists (the real API server is exercised by test_e2e.py)."""

from __future__ import annotations

import uuid

from kubernetes.client import ApiClient, V1NodeList, V1PodList

from lifeline.api.recovery import Holding
from lifeline.operator.observe import observe
from lifeline.catalog import Catalog


class _EmptyCluster:
    """``CoreV1Api`` double: no pods, no nodes."""

    api_client = ApiClient()

    def list_namespaced_pod(self, namespace, label_selector=""):
        return V1PodList(items=[])

    def list_node(self):
        return V1NodeList(items=[])


def test_latest_l2_step_is_observed_behind_newer_memory_steps(redis_server):
    catalog = Catalog(redis_server.url, f"obs-{uuid.uuid4().hex[:6]}", 2)
    try:
        for rank in range(2):
            catalog.add_holding(10, rank, "L2")
            catalog.add_holding(20, rank, "L2")
            for step in range(20, 27):
                catalog.add_holding(step, rank, "L0", rank)
        catalog.add_holding(30, 0, "L0", 0)  # a newer step not yet complete
        args = dict(namespace="ns", job=catalog.job, world_size=2, cool_downs={})
        without = observe(_EmptyCluster(), catalog, **args).catalog.holdings
        assert not any(h.tier == "L2" for h in without)  # only the 4 newest steps (25, 26, 30 ...)
        seen = observe(_EmptyCluster(), catalog, persist_every=10, **args).catalog.holdings
        # the two newest multiples of persist_every (30: still persisting; 20: the latest in L2)
        assert {Holding(20, r, "L2") for r in range(2)} <= seen
        assert Holding(30, 0, "L0", 0) in seen
    finally:
        catalog.wipe()
        catalog.close()
