"""The PodDisruptionBudget of one job (pure builder, no I/O).

``kubectl drain`` (and every other client of the Eviction API: cluster autoscaler scale-down, node
upgrades) evicts a node's pods only while the budgets selecting them allow it. A job's budget selects
every pod of the job (``lifeline.dev/job=<job>``) with ``minAvailable: <world size> - 1``: a drain takes
one rank at a time. Not ``maxUnavailable: 1``: the disruption controller resolves ``maxUnavailable``
through the pods' controller's scale subresource, which a TrainingJob lacks, and such a budget allows
no eviction at all (measured on the dev cluster: ``expectedPods 0``, ``disruptionsAllowed 0``); an
integer ``minAvailable`` counts the selected pods themselves. The operator updates it when the world
size changes (an elastic reshard). The evicted rank's trainer gets SIGTERM, checkpoints the step it completes to a peer's L1
within the pod's grace and leaves (docs/preemption.md); the job resumes at that step with the rank on
another node, and only once every pod of the job is Ready again does the next eviction pass. A drain
of a node holding several ranks of one job is therefore several such migrations in a row, each
losing no step: the spec has no failure domain wider than a node, and a Gemini placement (each
rank's L1 copies on other nodes) only promises that losing one node's ranks at once is recoverable
from L1, not that their copies were all made in the grace.

``unhealthyPodEvictionPolicy: AlwaysAllow``: a pod that is not Ready (already failing, or stuck
starting) never blocks a drain; the budget protects only a healthy job.
"""

from __future__ import annotations

from typing import Any

from lifeline.api.manifests import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, owner_reference
from lifeline.api.trainingjob import TrainingJob

__all__ = ["MAX_UNAVAILABLE", "disruption_budget_name", "min_available", "job_disruption_budget"]

MAX_UNAVAILABLE = 1
"""Pods of one job that voluntary disruptions (evictions) may take down at once."""


def disruption_budget_name(job: str) -> str:
    """The job's PodDisruptionBudget: ``<job>-lifeline``."""
    return f"{job}-lifeline"


def min_available(world_size: int) -> int:
    """The budget's ``minAvailable`` for ``world_size`` ranks: all but :data:`MAX_UNAVAILABLE` (never < 0)."""
    return max(0, world_size - MAX_UNAVAILABLE)


def job_disruption_budget(job: TrainingJob, world_size: int) -> dict[str, Any]:
    """The ``policy/v1`` PodDisruptionBudget of ``job``: at most :data:`MAX_UNAVAILABLE` of its pods evicted at once.

    Args:
        job: the validated TrainingJob read from the API server (``metadata.uid`` set).
        world_size: the current world size (the spec's layout, or the plan's after an elastic reshard).

    Returns:
        A PodDisruptionBudget dict owned by the job (garbage-collected with it).

    Raises:
        KeyError: ``metadata.uid`` is missing.
    """
    name = job.metadata["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": disruption_budget_name(name),
            "namespace": job.metadata.get("namespace"),
            "labels": {LABEL_JOB: name, LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "selector": {"matchLabels": {LABEL_JOB: name}},
            "minAvailable": min_available(world_size),
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
