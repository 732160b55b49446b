"""Node capacity for a job's pods (what an elastic reshard is decided on), from API objects."""

from __future__ import annotations

from decimal import Decimal

from lifeline.control.state import ClusterState, NodeState
from lifeline.operator.capacity import node_capacity, pod_requests, with_capacity


def _node(name: str, **allocatable: str) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


def _pod(node: str, *requests: dict, ns: str = "team-a", job: str | None = None, phase: str = "Running") -> dict:
    labels = {"lifeline.dev/job": job} if job else {}
    return {"metadata": {"namespace": ns, "labels": labels}, "spec": {"nodeName": node, "containers": [
        {"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(requests)]}, "status": {"phase": phase}}


def test_pod_requests_sum_containers_in_base_units():
    req = pod_requests(_pod("n", {"cpu": "1500m", "memory": "1Gi"}, {"cpu": "250m"}, {}))
    assert req == {"cpu": Decimal("1.75"), "memory": Decimal(1 << 30)}


def test_capacity_is_the_tightest_resource_after_other_pods():
    per_pod = {"cpu": Decimal(1), "memory": Decimal(2 << 30)}
    node = _node("n", cpu="4", memory="8Gi", pods="110")
    assert node_capacity(node, [], per_pod) == 4  # cpu 4, memory 4
    assert node_capacity(node, [_pod("n", {"memory": "3Gi"})], per_pod) == 2  # memory: 5 Gi left
    assert node_capacity(node, [_pod("n", {"cpu": "3500m"})], per_pod) == 0
    assert node_capacity(_node("n", cpu="4"), [], {"nvidia.com/gpu": Decimal(1)}) == 0  # not offered
    assert node_capacity(node, [], {}) is None  # requests nothing: not limited


def test_with_capacity_skips_the_jobs_own_and_finished_pods():
    nodes = {"a": _node("a", cpu="4"), "b": _node("b", cpu="4")}
    pods = [
        _pod("a", {"cpu": "2"}, job="gpt"),  # this job's: counted by the planner as load, not here
        _pod("a", {"cpu": "2"}, job="gpt", ns="team-b"),  # same name, other namespace: another job
        _pod("b", {"cpu": "3"}, phase="Succeeded"),
    ]
    cluster = ClusterState(nodes=(NodeState("a"), NodeState("b", ready=False)), cool_downs=(("b", 9.0),))
    out = with_capacity(cluster, nodes, pods, {"cpu": Decimal(1)}, namespace="team-a", job="gpt")
    assert [(n.name, n.ready, n.capacity) for n in out.nodes] == [("a", True, 2), ("b", False, 4)]
    assert out.cool_downs == (("b", 9.0),)
