"""What a job is given to reach shared services, and no more: its Secret (HMAC key, S3 and Redis
credentials), its Redis ACL user, its NetworkPolicy and its PodDisruptionBudget. Called by every reconcile (idempotent), so
an operator killed at any point, or a Redis restarted without its ACLs, is repaired next time.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any

from kubernetes.client import NetworkingV1Api, PolicyV1Api
from kubernetes.client.exceptions import ApiException

from lifeline.api.disruption import disruption_budget_name, job_disruption_budget, min_available
from lifeline.api.manifests import SECRET_REDIS_PASSWORD, SECRET_REDIS_USERNAME, job_secret, secret_name
from lifeline.api.netpol import job_network_policy, network_policy_name
from lifeline.api.trainingjob import TrainingJob
from lifeline.catalog import Catalog, job_user
from lifeline.operator import events

__all__ = ["ensure_secret", "ensure_network_policy", "ensure_disruption_budget", "ensure_redis_user"]


def _job_ref(job: TrainingJob) -> dict[str, Any]:
    return {"apiVersion": job.api_version, "kind": job.kind, "metadata": job.metadata}


def ensure_secret(env: Any, job: TrainingJob) -> dict[str, str]:
    """Create the job's Secret if absent (a new HMAC key; the S3 credentials; the job's Redis ACL
    user and a new password, or the shared Redis password). Returns its decoded data.

    Raises:
        kubernetes.client.ApiException: the API server refused (not 404/409).
    """
    ns, name = job.namespace, secret_name(job.name)
    try:
        found = env.core.read_namespaced_secret(name, ns)
        return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}
    except ApiException as err:
        if err.status != 404:
            raise
    s = env.settings
    if s.redis_job_users:
        redis_user, redis_password = job_user(job.name or ""), secrets.token_hex(32)
    else:
        redis_user, redis_password = "", s.redis_password.get_secret_value()
    body = job_secret(job, hmac_key=secrets.token_hex(32), s3_access_key=s.s3_access_key,
                      s3_secret_key=s.s3_secret_key.get_secret_value(), redis_username=redis_user,
                      redis_password=redis_password)
    try:
        env.core.create_namespaced_secret(ns, body)
    except ApiException as err:
        if err.status != 409:  # created meanwhile: keep the first key
            raise
        return ensure_secret(env, job)
    events.record(_job_ref(job), "SecretCreated", f"created Secret {name} with a new HMAC key for peer transfers")
    return dict(body["stringData"])


def ensure_redis_user(catalog: Catalog, data: Mapping[str, str]) -> None:
    """(Re)grant the job's Redis ACL user named in its Secret ``data`` (no-op without one).
    ``catalog`` must be the operator's admin connection.

    Raises:
        lifeline.errors.CatalogError: Redis refused (unreachable, or the connection is no admin).
    """
    if data.get(SECRET_REDIS_USERNAME) and data.get(SECRET_REDIS_PASSWORD):
        catalog.grant_job_user(data[SECRET_REDIS_PASSWORD])


def ensure_network_policy(env: Any, job: TrainingJob) -> None:
    """Create the job's NetworkPolicy (:func:`lifeline.api.netpol.job_network_policy`) if absent.

    Raises:
        kubernetes.client.ApiException: the API server refused (not 404/409).
    """
    api = NetworkingV1Api(env.core.api_client)
    ns, name = job.namespace, network_policy_name(job.name or "")
    try:
        api.read_namespaced_network_policy(name, ns)
        return
    except ApiException as err:
        if err.status != 404:
            raise
    try:
        api.create_namespaced_network_policy(ns, job_network_policy(job))
    except ApiException as err:
        if err.status != 409:
            raise
        return
    events.record(_job_ref(job), "NetworkPolicyCreated",
                  f"created NetworkPolicy {name}: only the job's own pods reach its pods")


def ensure_disruption_budget(env: Any, job: TrainingJob, world_size: int) -> None:
    """Create the job's PodDisruptionBudget (:func:`lifeline.api.disruption.job_disruption_budget`: a drain
    evicts one of its pods at a time) if absent; patch its ``minAvailable`` when ``world_size`` (the current
    one, which an elastic reshard changes) asks for another.

    Raises:
        kubernetes.client.ApiException: the API server refused (not 404/409).
    """
    api = PolicyV1Api(env.core.api_client)
    ns, name = job.namespace, disruption_budget_name(job.name or "")
    want = min_available(world_size)
    try:
        found = api.read_namespaced_pod_disruption_budget(name, ns)
        if found.spec is not None and found.spec.min_available != want:
            api.patch_namespaced_pod_disruption_budget(name, ns, {"spec": {"minAvailable": want}})
        return
    except ApiException as err:
        if err.status != 404:
            raise
    try:
        api.create_namespaced_pod_disruption_budget(ns, job_disruption_budget(job, world_size))
    except ApiException as err:
        if err.status != 409:
            raise
        return
    events.record(_job_ref(job), "DisruptionBudgetCreated",
                  f"created PodDisruptionBudget {name}: an eviction (kubectl drain) takes one pod at a time")
