"""The NetworkPolicy of one job (pure builder, no I/O).

A job's pods talk to each other on the sidecars' peer port (replication, restore, upstream logs),
the rendezvous store of each generation and the collective library's (gloo/NCCL) ports, which are
chosen at run time. The policy selects every pod of the job (``lifeline.dev/job=<job>``) and
admits ingress only from pods of the same job in the same namespace, on any port: no other pod
can reach the sidecars (whose peer frames are HMAC-authenticated too) or the trainers.

Kubernetes policies are additive: to let Prometheus scrape the sidecars' metrics port, add a
policy admitting it (kubelet probes come from the node and are admitted by common CNIs).
"""

from __future__ import annotations

from typing import Any

from lifeline.api.manifests import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, owner_reference
from lifeline.api.trainingjob import TrainingJob

__all__ = ["network_policy_name", "job_network_policy"]


def network_policy_name(job: str) -> str:
    """The job's NetworkPolicy: ``<job>-lifeline``."""
    return f"{job}-lifeline"


def job_network_policy(job: TrainingJob) -> dict[str, Any]:
    """The ``networking.k8s.io/v1`` NetworkPolicy of ``job``: ingress to its pods only from its pods.

    Args:
        job: the validated TrainingJob read from the API server (``metadata.uid`` set).

    Returns:
        A NetworkPolicy dict owned by the job (garbage-collected with it).

    Raises:
        KeyError: ``metadata.uid`` is missing.
    """
    name = job.metadata["name"]
    own = {"matchLabels": {LABEL_JOB: name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(name),
            "namespace": job.metadata.get("namespace"),
            "labels": {LABEL_JOB: name, LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own}]}],
        },
    }
