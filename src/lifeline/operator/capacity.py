"""How many of a job's pods each node can host: the ``capacity`` of control's :class:`NodeState`.

An elastic reshard (DESIGN.md's last rung) is chosen only when the healthy nodes cannot hold the
lost ranks, so the planner needs each node's room, measured the way the scheduler's resource fit
measures it (NodeResourcesFit: the sum of the requests of the pods bound to the node against its
``status.allocatable``):

    capacity(node) = min over resources r the rank pod requests of
                     floor((allocatable[r] - requested[r] by the node's other pods) / request[r])

"Other pods" are the node's pods that are not terminated (phase not Succeeded/Failed) and do not
belong to this job, among the pods the operator may list: by default those of the namespaces it
watches (its Roles allow it), every namespace only with the chart's opt-in
``operator.listPodsClusterWide`` (docs/security.md); the job's own pods on the node are counted by the planner as load, so they
are part of the capacity. A resource the node does not offer gives 0. A rank pod with no requests
gives ``None`` (not limited). Pure functions over API objects (dicts, as the API returns them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from lifeline.api.manifests import LABEL_JOB
from lifeline.control.state import ClusterState, NodeState

__all__ = ["pod_requests", "node_capacity", "with_capacity"]


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Sum of the containers' ``resources.requests`` of ``pod`` (a pod dict), by resource name
    (cpu in cores, memory in bytes, extended resources in units). Init containers are ignored:
    they do not run beside the others."""
    out: dict[str, Decimal] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for name, qty in ((c.get("resources") or {}).get("requests") or {}).items():
            out[name] = out.get(name, Decimal(0)) + parse_quantity(qty)
    return out


def node_capacity(node: Mapping[str, Any], others: Iterable[Mapping[str, Any]],
                  per_pod: Mapping[str, Decimal]) -> int | None:
    """Pods needing ``per_pod`` that fit on ``node`` beside ``others`` (its pods of other jobs);
    ``None`` when ``per_pod`` requests nothing."""
    wanted = {r: q for r, q in per_pod.items() if q > 0}
    if not wanted:
        return None
    allocatable = {r: parse_quantity(q) for r, q in ((node.get("status") or {}).get("allocatable") or {}).items()}
    used: dict[str, Decimal] = {}
    for pod in others:
        for r, q in pod_requests(pod).items():
            used[r] = used.get(r, Decimal(0)) + q
    fits = [max(0, int((allocatable.get(r, Decimal(0)) - used.get(r, Decimal(0))) // q)) for r, q in wanted.items()]
    return min(fits)


def with_capacity(cluster: ClusterState, nodes: Mapping[str, Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                  per_pod: Mapping[str, Decimal], *, namespace: str, job: str) -> ClusterState:
    """``cluster`` with every node's ``capacity`` for pods of ``job`` needing ``per_pod``.

    Args:
        cluster: the observed cluster (capacities unset).
        nodes: every node's raw object by name.
        pods: the pods counted as load (all namespaces, or the watched ones); terminated ones and
            ``job``'s are skipped.
        per_pod: one rank pod's requests (:func:`pod_requests` of the pod the operator builds).
        namespace, job: the TrainingJob (its pods carry ``lifeline.dev/job=<job>`` in ``namespace``).
    """
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        meta = pod.get("metadata") or {}
        ours = meta.get("namespace") == namespace and (meta.get("labels") or {}).get(LABEL_JOB) == job
        if node and not ours and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            by_node.setdefault(node, []).append(pod)
    return ClusterState(
        nodes=tuple(NodeState(n.name, n.ready, n.schedulable,
                              node_capacity(nodes.get(n.name) or {}, by_node.get(n.name, ()), per_pod))
                    for n in cluster.nodes),
        cool_downs=cluster.cool_downs)
