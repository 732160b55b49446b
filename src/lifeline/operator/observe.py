"""Read what is real — the job's pods, the nodes, the Redis catalog — for :mod:`lifeline.control`.

Two layers: pure functions (:func:`pod_signals`, :func:`node_states`, :func:`node_signals`,
:func:`sidecar_states`) that turn API objects into control's signal and state dataclasses, tested
without a cluster; and :func:`observe`, the one function doing I/O (Kubernetes API list calls,
one :meth:`lifeline.catalog.Catalog.view`) that feeds them.

Container failures are signals only once: the plan that answers them records every pod's
:func:`terminations` (by pod UID) in the TrainingJob's annotations, so a trainer the kubelet
restarted in place is not a new failure at the next resync, and an operator restarted
mid-recovery sees exactly the failures it has not handled yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from lifeline.api.manifests import LABEL_GENERATION, LABEL_RANK, SIDECAR_CONTAINER, job_selector
from lifeline.api.trainingjob import TRAINER_CONTAINER
from lifeline.catalog import Catalog, CatalogView
from lifeline.control import ClusterState, ContainerTerminated, NodeCondition, NodeState, PodGone, SidecarState, Signal
from lifeline.errors import CatalogError
from lifeline.operator.capacity import with_capacity

log = logging.getLogger(__name__)

__all__ = [
    "UNREACHABLE_TAINT",
    "Observation",
    "pods_by_rank",
    "pod_generation",
    "terminations",
    "pod_signals",
    "leaving",
    "node_states",
    "node_signals",
    "sidecar_states",
    "observe",
]

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
_NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pods_by_rank(
    pods: Iterable[Mapping[str, Any]], world_size: int, *, terminating: bool = False
) -> dict[int, Mapping[str, Any]]:
    """The job's pods keyed by rank (label ``lifeline.dev/rank``), leaving out ranks outside the
    world size (left from a larger layout). ``terminating=False``: the live pods; ``True``: the
    pods being deleted (e.g. evicted from a lost node), whose rank must be recreated."""
    out: dict[int, Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        try:
            rank = int((meta.get("labels") or {}).get(LABEL_RANK, ""))
        except ValueError:
            continue
        if 0 <= rank < world_size and bool(meta.get("deletionTimestamp")) == terminating:
            out[rank] = pod
    return out


def pod_generation(pod: Mapping[str, Any]) -> int:
    """The generation a pod was created for (label ``lifeline.dev/generation``; 0 if absent)."""
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_GENERATION, "0"))
    except ValueError:
        return 0


def terminations(pod: Mapping[str, Any]) -> dict[str, int]:
    """Failed runs of each container of ``pod`` so far: ``restartCount``, plus one while the
    container sits terminated with a non-zero code (waiting for its in-place restart)."""
    out = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        failed_now = term is not None and int(term.get("exitCode", 0)) != 0
        out[cs["name"]] = int(cs.get("restartCount", 0)) + int(failed_now)
    return out


def pod_signals(
    pods: Mapping[int, Mapping[str, Any]],
    world_size: int,
    *,
    missing_is_failure: bool,
    handled: Mapping[str, Mapping[str, int]] | None = None,
    ignore: Iterable[int] = (),
) -> list[Signal]:
    """Failure signals of the job's pods.

    Args:
        pods: the live pods by rank (:func:`pods_by_rank`).
        world_size: number of ranks.
        missing_is_failure: True once every pod of the current generation was created: a
            missing pod is then :class:`PodGone`. False while pods are still being created.
        handled: pod UID -> container -> :func:`terminations` already acted on (recorded with
            the plan that answered them); only terminations beyond these are signals.
        ignore: ranks whose pods the current plan replaces (their old incarnation says nothing new).

    Returns:
        :class:`PodGone` for a missing or Failed (e.g. evicted) pod; :class:`ContainerTerminated`
        for each container with new failed runs (exit code of ``state.terminated``, else of
        ``lastState.terminated``). A trainer that exited 0 is not a signal.
    """
    handled = handled or {}
    skip = set(ignore)
    out: list[Signal] = []
    for rank in range(world_size):
        if rank in skip:
            continue
        pod = pods.get(rank)
        if pod is None:
            if missing_is_failure:
                out.append(PodGone(rank, None, "pod missing"))
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            out.append(PodGone(rank, node, status.get("reason") or "pod phase Failed"))
            continue
        seen = handled.get((pod.get("metadata") or {}).get("uid", ""), {})
        now = terminations(pod)
        for cs in status.get("containerStatuses") or []:
            name = cs["name"]
            if now.get(name, 0) <= seen.get(name, 0):
                continue
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            code = int(term.get("exitCode", 1)) or 1
            out.append(ContainerTerminated(rank, node, name, code, term.get("reason", "")))
    return out


def node_states(nodes: Iterable[Mapping[str, Any]]) -> tuple[NodeState, ...]:
    """Control's :class:`NodeState` of every node: ready (Ready True, no unreachable/not-ready
    taint) and schedulable (not cordoned)."""
    out = []
    for node in nodes:
        meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        ready = next((c.get("status") == "True" for c in status.get("conditions") or [] if c.get("type") == "Ready"), False)
        taints = {t.get("key") for t in spec.get("taints") or []}
        ready = ready and UNREACHABLE_TAINT not in taints and _NOT_READY_TAINT not in taints
        out.append(NodeState(name=meta["name"], ready=ready, schedulable=not spec.get("unschedulable", False)))
    return tuple(sorted(out, key=lambda n: n.name))


def node_signals(nodes: Iterable[Mapping[str, Any]], used: Iterable[str]) -> list[Signal]:
    """A :class:`NodeCondition` for each node in ``used`` (nodes running the job's pods); a used
    node missing from ``nodes`` (deleted) is reported not ready."""
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    out: list[Signal] = []
    for name in sorted(set(used)):
        node = by_name.get(name)
        if node is None:
            out.append(NodeCondition(name, False, unreachable=True))
            continue
        cond = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        ready = None if cond is None or cond.get("status") == "Unknown" else cond.get("status") == "True"
        taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
        out.append(NodeCondition(name, ready, unreachable=UNREACHABLE_TAINT in taints))
    return out


def sidecar_states(pods: Mapping[int, Mapping[str, Any]], last_seen: Mapping[tuple[int, str], float] | None = None
                   ) -> tuple[SidecarState, ...]:
    """Control's :class:`SidecarState` of each pod whose sidecar container is running and Ready.

    Args:
        pods: the live pods by rank.
        last_seen: ``(rank, pod UID) -> when this operator last saw that sidecar registered`` (its
            memory, lost on restart: then the sidecar's start time and the startup grace apply).
    """
    seen = last_seen or {}
    out = []
    for rank, pod in sorted(pods.items()):
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                   if c["name"] == SIDECAR_CONTAINER), None)
        started = _parse_time((((cs or {}).get("state") or {}).get("running") or {}).get("startedAt"))
        if cs is None or not cs.get("ready") or started is None:
            continue
        uid = (pod.get("metadata") or {}).get("uid", "")
        out.append(SidecarState(rank, (pod.get("spec") or {}).get("nodeName"), started, seen.get((rank, uid))))
    return tuple(out)


def leaving(terminating: Mapping[int, Mapping[str, Any]], now: float) -> frozenset[int]:
    """Ranks whose pod is being deleted within its grace (``deletionTimestamp``, when the kubelet SIGKILLs
    it, is after ``now``) while its trainer still runs: a preempted, evicted (``kubectl drain``) or deleted
    pod whose trainer checkpoints the step it completes to L1 before it leaves (docs/preemption.md). Such a
    rank is no failure yet: a plan made now would restore an older step than the one being saved. It is one
    once the pod is gone, its trainer exited, or the grace ran out."""
    out = set()
    for rank, pod in terminating.items():
        until = _parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                   if c["name"] == TRAINER_CONTAINER), None)
        if until is not None and until > now and ((cs or {}).get("state") or {}).get("running") is not None:
            out.add(rank)
    return frozenset(out)


def trainer_starts(pods: Mapping[int, Mapping[str, Any]]) -> dict[int, float]:
    """rank -> when its trainer container last started running (seconds since the epoch), for each
    pod whose trainer runs. ``startedAt`` has whole seconds: a start counts from the end of its second,
    so a word its previous incarnation said within that second is never taken for the new one's."""
    out = {}
    for rank, pod in sorted(pods.items()):
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                   if c["name"] == TRAINER_CONTAINER), None)
        started = _parse_time((((cs or {}).get("state") or {}).get("running") or {}).get("startedAt"))
        if started is not None:
            out[rank] = started + 1.0
    return out


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile saw (built by :func:`observe`).

    Attributes:
        pods: live pods by rank.
        nodes: every node's raw object by name.
        cluster: control's :class:`ClusterState` (node capacities filled in when known).
        terminating: pods being deleted, by rank (not live; their node is still known).
        catalog: the catalog's view (``None`` when it could not be read).
        catalog_error: why the catalog could not be read (``None`` when it was).
        at: seconds since the epoch when observed.
    """

    pods: Mapping[int, Mapping[str, Any]]
    nodes: Mapping[str, Mapping[str, Any]]
    cluster: ClusterState
    terminating: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    catalog: CatalogView | None = None
    catalog_error: str | None = None
    at: float = 0.0

    @property
    def registered(self) -> frozenset[int]:
        """Ranks with a live sidecar registration (empty without a catalog view)."""
        return frozenset(self.catalog.registrations) if self.catalog is not None else frozenset()

    def node_of_rank(self, world_size: int) -> tuple[str | None, ...]:
        """Node of each rank's pod, live or terminating (``None`` when unscheduled or missing)."""
        def node(r: int) -> str | None:
            pod = self.pods.get(r) or self.terminating.get(r) or {}
            return (pod.get("spec") or {}).get("nodeName")

        return tuple(node(r) for r in range(world_size))


def observe(core: CoreV1Api, catalog: Catalog | None, *, namespace: str, job: str, world_size: int,
            cool_downs: Mapping[str, float], recent_steps: int = 4, persist_every: int = 0,
            pod_requests: Mapping[str, Any] | None = None,
            capacity_namespaces: Sequence[str] | None = None) -> Observation:
    """Read the job's pods, every node, and the catalog.

    Args:
        core: a ``kubernetes.client.CoreV1Api``.
        catalog: the job's :class:`~lifeline.catalog.Catalog` (``None``: none configured).
        namespace, job: the TrainingJob.
        world_size: current number of ranks.
        cool_downs: node -> expiry (seconds since epoch), from the job's annotation.
        recent_steps: how many of the newest catalog steps to read holdings of.
        persist_every: the job's L2 interval (steps; 0: none); the latest L2 checkpoint is read
            too however many memory-tier steps came after it (a reshard restores from it).
        pod_requests: one rank pod's resource requests; when given, every node's capacity for the
            job is filled in (:mod:`lifeline.operator.capacity`) from the pods of
            ``capacity_namespaces``: without the right to list them (403) capacities stay unknown.
        capacity_namespaces: whose pods' requests count against node allocatable; ``None``: every
            namespace (one cluster-wide list, the opt-in ``LIST_PODS_CLUSTER_WIDE`` or a
            cluster-wide operator). Pods of other namespaces are then not seen, so a node's room
            may be overestimated; the scheduler still refuses a pod that does not fit (it stays
            Pending and the next reconcile sees it).

    Raises:
        kubernetes.client.ApiException: the API server refused a list call (the handler retries).
    """
    api = core.api_client
    pods_raw = api.sanitize_for_serialization(core.list_namespaced_pod(namespace, label_selector=job_selector(job)).items)
    nodes_raw = api.sanitize_for_serialization(core.list_node().items)
    nodes = {n["metadata"]["name"]: n for n in nodes_raw}
    cluster = ClusterState(nodes=node_states(nodes_raw), cool_downs=tuple(sorted(cool_downs.items())))
    if pod_requests:
        cluster = _with_capacity(core, cluster, nodes, pod_requests, namespace=namespace, job=job,
                                 namespaces=capacity_namespaces)
    obs = dict(pods=pods_by_rank(pods_raw, world_size), terminating=pods_by_rank(pods_raw, world_size, terminating=True),
               nodes=nodes, cluster=cluster, at=time.time())
    if catalog is None:
        return Observation(**obs, catalog_error="no catalog configured")
    try:
        view = catalog.view(recent_steps=recent_steps, persist_every=persist_every)
    except CatalogError as err:
        return Observation(**obs, catalog_error=str(err))
    return Observation(**obs, catalog=view)


def _with_capacity(core: CoreV1Api, cluster: ClusterState, nodes: Mapping[str, Any], per_pod: Mapping[str, Any], *,
                   namespace: str, job: str, namespaces: Sequence[str] | None) -> ClusterState:
    live = "status.phase!=Succeeded,status.phase!=Failed"
    try:
        if namespaces is None:
            items = core.list_pod_for_all_namespaces(field_selector=live).items
        else:
            items = [p for ns in namespaces for p in core.list_namespaced_pod(ns, field_selector=live).items]
    except ApiException as err:
        if err.status != 403:
            raise
        log.warning("cannot list pods of %s (%s): node capacities unknown, so no elastic reshard",
                    "every namespace" if namespaces is None else ",".join(namespaces), err.reason)
        return cluster
    raw = core.api_client.sanitize_for_serialization(items)
    return with_capacity(cluster, nodes, raw, per_pod, namespace=namespace, job=job)
