"""Observe → decide → act → report, for one TrainingJob. The only module that writes to the cluster.

Order of writes, so that killing the operator at any point is safe (the next reconcile,
by the same or a new operator, repeats what is missing and nothing twice):

1. the job's Secret, NetworkPolicy and PodDisruptionBudget (create if absent), its Redis ACL user (re-granted);
2. a new plan: the TrainingJob's annotations (:mod:`lifeline.operator.recorded`), *then* the
   catalog's ``plan:<generation>`` (re-published at every reconcile until the catalog has it);
3. pod deletions (replaced incarnations, force-deleted: their node may be gone), then pod
   creations at the current generation (409 for a pod still terminating: retried next time;
   a template no pod can be built from, or a pod the API server (or the client) refuses as
   invalid — 400, 422, an admission plugin's 403 — is an invalid spec: the job is marked Failed once, never retried);
4. ``lifeline.dev/applied`` once every pod of the generation exists;
5. status (subresource), events and metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from lifeline.api.manifests import LABEL_GENERATION, PodConfig, pod_name
from lifeline.api.trainingjob import (
    GROUP,
    PLURAL,
    VERSION,
    RecoveryAction,
    RecoveryRecord,
    TrainingJob,
    TrainingJobStatus,
)
from lifeline.api import StragglerSpec
from lifeline.catalog import Catalog
from lifeline.control.stragglers import StragglerWatch
from lifeline.operator import events, metrics
from lifeline.operator.access import (ensure_disruption_budget, ensure_network_policy, ensure_redis_user,
                                      ensure_secret)
from lifeline.operator.capacity import pod_requests
from lifeline.operator.decide import Reconcile, decide_from_cluster
from lifeline.operator.observe import Observation, observe
from lifeline.operator.recorded import Recorded
from lifeline.operator.settings import OperatorSettings
from lifeline.operator.spec import InvalidSpec, build_pod, invalid_spec, parse_job, pod_refused, refuses_the_pod
from lifeline.operator.spare import spare, unspare
from lifeline.operator.status import known_status, next_status, recovery_record
from lifeline.operator.stragglers import straggler_round

__all__ = ["Env", "reconcile", "forget_job"]

log = logging.getLogger("lifeline.operator")


@dataclass
class Env:
    """The operator's clients and settings, built once at startup.

    Attributes:
        core: ``kubernetes.client.CoreV1Api``.
        custom: ``kubernetes.client.CustomObjectsApi``.
        settings: :class:`~lifeline.operator.settings.OperatorSettings`.
    """

    core: CoreV1Api
    custom: CustomObjectsApi
    settings: OperatorSettings
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _seen: dict[str, dict[tuple[int, str], float]] = field(default_factory=dict, repr=False)
    _stragglers: dict[str, StragglerWatch] = field(default_factory=dict, repr=False)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock serialising reconciles of one job (kopf runs its timer beside the other handlers)."""
        with self._guard:
            return self._locks.setdefault(f"{namespace}/{name}", threading.Lock())

    @property
    def pod_config(self) -> PodConfig:
        """The operator-wide inputs of every pod."""
        s = self.settings
        return PodConfig(
            redis_url=s.redis_url,
            sidecar_image=s.sidecar_image,
            service_account=s.pod_service_account,
            s3_endpoint=s.s3_endpoint,
            s3_secure=s.s3_secure,
            peer_port=s.sidecar_peer_port,
            metrics_port=s.sidecar_metrics_port,
            sidecar_resources=s.sidecar_resources,
        )

    def catalog(self, job: str, world_size: int) -> Catalog:
        """The job's :class:`lifeline.catalog.Catalog` over the operator's own (admin) connection."""
        return Catalog(self.settings.redis_url, job, world_size, username="",
                       password=self.settings.redis_password.get_secret_value())

    def last_seen(self, namespace: str, name: str) -> dict[tuple[int, str], float]:
        """Soft memory of one job: ``(rank, pod UID) -> when its sidecar was last seen registered``.
        Lost when the operator restarts, which only makes a silent sidecar wait out its startup grace."""
        with self._guard:
            return self._seen.setdefault(f"{namespace}/{name}", {})

    def straggler_watch(self, uid: str, spec: StragglerSpec) -> StragglerWatch:
        """The straggler watch of the job with UID ``uid`` (soft memory, like :meth:`last_seen`); a new one
        when ``spec`` (``spec.recovery.straggler``) changed."""
        with self._guard:
            watch = self._stragglers.get(uid)
            if watch is None or watch.spec != spec:
                watch = self._stragglers[uid] = StragglerWatch(spec)
            return watch


def _rank_pod_requests(env: Env, body: Mapping[str, Any], job: TrainingJob) -> dict[str, Any] | None:
    """One rank pod's resource requests when the job may reshard elastically (only then does the
    planner need node capacities); ``None`` otherwise.

    Raises:
        lifeline.operator.spec.InvalidSpec: the template's resources cannot be read.
    """
    if job.spec.recovery.elastic is None:
        return None
    pod = build_pod(body, job, 0, generation=0, config=env.pod_config)
    try:
        return pod_requests(pod)
    except (TypeError, AttributeError, ValueError, KeyError) as err:
        raise invalid_spec(body, f"spec.template.spec.containers[].resources cannot be read: {err}; write "
                           "requests and limits as maps of quantities (cpu: 500m, memory: 1Gi)",
                           field="spec.template.spec.containers[].resources") from err


def _capacity_namespaces(s: OperatorSettings) -> list[str] | None:
    """Whose pods count against node capacity: every namespace (``None``) when cluster-wide pod
    listing is opted into or the operator watches every namespace; else the watched ones."""
    return None if s.list_pods_cluster_wide or not s.namespaces else list(s.namespaces)


def _job_ref(job: TrainingJob) -> dict[str, Any]:
    """A minimal object reference body for events."""
    return {"apiVersion": job.api_version, "kind": job.kind, "metadata": job.metadata}


def forget_job(env: Env, body: Mapping[str, Any]) -> None:
    """Delete the job's catalog keys if this job (by UID) owns them. Pods and the Secret go with
    the TrainingJob through their ownerReferences (garbage collection)."""
    meta = body.get("metadata") or {}
    catalog = env.catalog(meta["name"], 1)
    try:
        if catalog.forget(meta.get("uid", "")) and env.settings.redis_job_users:
            catalog.revoke_job_user()
    finally:
        catalog.close()
    with env._guard:
        env._seen.pop(f"{meta.get('namespace', '')}/{meta['name']}", None)
        env._stragglers.pop(meta.get("uid", ""), None)


def _patch_job(env: Env, job: TrainingJob, patch: dict[str, Any]) -> None:
    env.custom.patch_namespaced_custom_object(GROUP, VERSION, job.namespace, PLURAL, job.name, patch)


def _patch_status(env: Env, job: TrainingJob, status: Mapping[str, Any]) -> None:
    env.custom.patch_namespaced_custom_object_status(GROUP, VERSION, job.namespace, PLURAL, job.name,
                                                     {"status": status})


def _force_delete(env: Env, name: str, namespace: str) -> None:
    """Delete a pod with grace 0 (its node may be gone and never confirm); absent is fine."""
    try:
        env.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as err:
        if err.status != 404:
            raise


def _act_on_pods(env: Env, body: Mapping[str, Any], job: TrainingJob, d: Reconcile) -> bool:
    """Delete then create pods; True when every pod of ``d.create`` exists afterwards.

    Raises:
        lifeline.operator.spec.InvalidSpec: no pod can be built from the template, or the API
            server refuses one as invalid (400, 422): the same template fails every time.
    """
    ns = job.namespace
    for rank in d.delete:
        _force_delete(env, pod_name(job.name, rank), ns)
    complete = True
    config = env.pod_config
    for rank in d.create:
        pod = build_pod(body, job, rank, generation=d.generation, config=config, layout=d.layout,
                         avoid_nodes=d.avoid_nodes)
        try:
            env.core.create_namespaced_pod(ns, pod)
        except ValidationError as err:  # the client's own check of the pod body: as a 422, before sending
            raise pod_refused(body, pod["metadata"]["name"], err) from err
        except ApiException as err:
            if refuses_the_pod(err):  # invalid: the same template is refused every time
                raise pod_refused(body, pod["metadata"]["name"], err) from err
            if err.status == 409:  # exists: ours from an earlier try, or the old one still terminating
                existing = env.core.read_namespaced_pod(pod["metadata"]["name"], ns)
                labels = existing.metadata.labels or {}
                if existing.metadata.deletion_timestamp is None and labels.get(LABEL_GENERATION) == str(d.generation):
                    continue
                if existing.metadata.deletion_timestamp is not None:  # stuck terminating: free the name
                    _force_delete(env, pod["metadata"]["name"], ns)
                complete = False
                continue
            raise
        events.record(_job_ref(job), "PodCreated", f"created pod {pod['metadata']['name']} (rank {rank}, "
                      f"generation {d.generation}" + (f", avoiding {sorted(d.avoid_nodes)})" if d.avoid_nodes else ")"))
    return complete


def reconcile(env: Env, body: Mapping[str, Any], *, now: float | None = None) -> Reconcile | None:
    """Run one reconcile of the TrainingJob ``body`` (re-read from the API server first); returns
    the decision (``None`` when the job is gone or finished: Succeeded or Failed jobs are left alone).

    Raises:
        lifeline.operator.spec.InvalidSpec: the spec is invalid; the job's status is already
            marked Failed with the reason (the handler records the event).
        kubernetes.client.ApiException, lifeline.errors.CatalogError: transient API or Redis
            failures (the handler retries with back-off).
    """
    meta = body.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    with env.lock(ns, name):
        # Re-read the job: kopf's copy may predate our own last commit (a timer tick racing the watch).
        try:
            body = env.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                return None  # deleted meanwhile
            raise
        try:
            return _reconcile(env, body, now=now)
        except InvalidSpec as err:
            # marked Failed under the job's lock: a timer tick waiting on it then reads Failed and
            # leaves the job alone instead of failing it a second time
            try:
                env.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                                 {"status": err.status})
            except ApiException as patch_err:
                if patch_err.status != 404:  # deleted meanwhile: nothing to mark
                    raise
            raise


def _status(raw: Mapping[str, Any], job: TrainingJob) -> TrainingJobStatus:
    """The job's status as its pydantic model (unknown fields dropped; a status the model refuses,
    written by hand, is logged and started over)."""
    try:
        return TrainingJobStatus.model_validate(known_status(raw))
    except ValidationError as err:
        log.warning("%s/%s: ignoring an invalid status: %s", job.namespace, job.name, err)
        return TrainingJobStatus()


def _observe_sidecars(env: Env, job: TrainingJob, obs: Observation, now: float) -> dict[tuple[int, str], float]:
    """Remember when each live pod's sidecar was seen registered on its node (soft memory)."""
    seen = env.last_seen(job.namespace or "", job.name or "")
    registrations = obs.catalog.registrations if obs.catalog is not None else {}
    live = set()
    for rank, pod in obs.pods.items():
        key = (rank, (pod.get("metadata") or {}).get("uid", ""))
        live.add(key)
        reg = registrations.get(rank)
        if reg is not None and reg.node == (pod.get("spec") or {}).get("nodeName"):
            seen[key] = now
    for key in [k for k in seen if k not in live]:
        del seen[key]
    return dict(seen)


def _reconcile(env: Env, body: Mapping[str, Any], *, now: float | None) -> Reconcile | None:
    started = time.perf_counter()
    now = time.time() if now is None else now
    job = parse_job(body)
    status = _status(body.get("status") or {}, job)
    if status.phase in ("Succeeded", "Failed"):
        return None
    meta = job.metadata
    recorded = Recorded.from_annotations(meta.get("annotations"))
    world = (recorded.plan.layout if recorded.plan else job.spec.layout).world_size
    secret = ensure_secret(env, job)
    ensure_network_policy(env, job)
    ensure_disruption_budget(env, job, world)
    catalog = env.catalog(job.name or "", world)
    try:
        catalog.own(meta["uid"])
        if env.settings.redis_job_users:
            ensure_redis_user(catalog, secret)
        persist = job.spec.checkpoint.persist
        obs = observe(env.core, catalog, namespace=job.namespace or "", job=job.name or "", world_size=world,
                      cool_downs=recorded.cool_downs, pod_requests=_rank_pod_requests(env, body, job),
                      capacity_namespaces=_capacity_namespaces(env.settings),
                      persist_every=persist.every if persist else 0)
        if obs.catalog_error:  # logged, not an event per resync; decisions without the catalog stay safe
            log.warning("%s/%s: cannot read the catalog: %s", job.namespace, job.name, obs.catalog_error)
        d = decide_from_cluster(job.spec, recorded, obs, status, now=now, last_seen=_observe_sidecars(env, job, obs, now))
        if d.plan is not None and d.plan.reads_memory and not spare(
                catalog, d.plan, job.spec.recovery.startup_grace_seconds):
            # the plan's step left the sidecars' memory since the catalog was read (a grow's, or a
            # recovery's: a save sealed after the read evicts it with keep 1, fuzz seed 3085): plan
            # again at the next resync
            grow = d.plan.reads_memory_while_training
            events.record(body, "GrowDeferred" if grow else "RecoveryDeferred",
                          f"step {d.plan.restore_step} left sidecar memory before the "
                          f"{'grow' if grow else 'plan'} was published; planning again")
            return
        recovery: RecoveryRecord | None = None
        if d.plan is not None:
            for f in d.failures:
                metrics.FAILURES.labels(job.namespace, job.name, f.kind.value).inc()
                events.record(body, "FailureDetected", f.describe())
            if d.plan.action is RecoveryAction.GIVE_UP:
                events.record(body, "GiveUp", d.plan.reason)
            else:
                patch = recorded.commit_patch(d.plan, d.handled or {})
                _patch_job(env, job, patch)  # the commit point
                metrics.RECOVERIES.labels(job.namespace, job.name, d.plan.action.value).inc()
                events.record(body, d.plan.action.value, f"generation {d.plan.generation}: {d.plan.reason}")
                recovery = recovery_record(d.plan, now)
                recorded = Recorded.from_annotations({**(meta.get("annotations") or {}),
                                                      **patch["metadata"]["annotations"]})
        current = d.plan if d.plan is not None and d.plan.action is not RecoveryAction.GIVE_UP else recorded.plan
        if current is not None and catalog.generation() < current.generation:
            # survivors act on it in their processes (an elastic reshard's too: kept pods adopt its layout)
            catalog.put_plan(current)
        if d.phase != "Failed" and (d.delete or d.create):
            if _act_on_pods(env, body, job, d) and recorded.applied < d.generation:
                _patch_job(env, job, Recorded.applied_patch(d.generation))
        elif d.phase not in ("Failed", "Succeeded") and recorded.applied < d.generation:
            _patch_job(env, job, Recorded.applied_patch(d.generation))
        if recovery is None and current is not None and d.phase == "Recovering" and not any(
                r.generation == current.generation for r in status.recoveries):
            recovery = recovery_record(current, now)  # the status write after the commit was lost: redo it
        if d.resumed:
            recovery = _close_recovery(status, d.generation, now)
            if current is not None and current.reads_memory:
                unspare(catalog)  # the restore read what the plan spared: the sidecars may evict it
        if d.phase != status.phase:
            if d.resumed and d.phase == "Succeeded":  # resumed and finished between two resync ticks
                events.record(body, "Recovered", f"training resumed in generation {d.generation} and finished")
            if d.phase in ("Running", "Succeeded", "Failed"):
                events.record(body, {"Running": "Recovered" if d.resumed else "Running", "Succeeded": "Succeeded",
                                     "Failed": "Failed"}[d.phase], d.message)
        view = obs.catalog
        # a catalog without progress or a complete step (its Redis came back empty) keeps the last ones
        # seen: status.step is the engine's fallback state step (operator.decide.record_of)
        progress_step = max((r.step or 0 for r in view.reports.values()), default=status.step) \
            if view is not None else status.step
        complete_step = view.complete_step if view is not None and view.complete_step is not None \
            else status.complete_step
        if complete_step is not None:
            metrics.CHECKPOINT_LAG.labels(job.namespace, job.name).set(max(0, progress_step - complete_step))
        stragglers = straggler_round(
            env, body, job, view, obs.pods, world_size=d.layout.world_size, layout=d.layout, old=status.stragglers,
            recorded=recorded, may_replace=d.phase == "Running" and d.plan is None and not (d.delete or d.create),
            now=now)
        old = status.to_wire()
        new_status = next_status(
            old, phase=d.phase, reason=d.reason, message=d.message, observed_generation=meta.get("generation"),
            step=progress_step, complete_step=complete_step, generation=d.generation,
            restarts=current.restarts if current is not None else None,
            replicas=d.layout.world_size, layout=d.layout.to_wire(),
            recovery=recovery.to_wire() if recovery is not None else None, stragglers=stragglers,
        )
        if _differs(old, new_status):
            _patch_status(env, job, new_status)
        return d
    finally:
        catalog.close()
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)


def _close_recovery(status: TrainingJobStatus, generation: int, now: float) -> RecoveryRecord | None:
    """The recovery record of ``generation`` with ``resumedAt``/``seconds`` set (``None`` if absent)."""
    rec = next((r for r in status.recoveries if r.generation == generation), None)
    if rec is None or rec.resumed_at is not None:
        return None
    seconds = max(0.0, now - rec.started_at.timestamp())
    metrics.RECOVERY_SECONDS.labels(rec.kind.value).observe(seconds)
    return rec.model_copy(update={"resumed_at": datetime.fromtimestamp(int(now), timezone.utc),
                                  "seconds": round(seconds, 3)})


def _differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when ``new`` changes more than condition timestamps would (avoid a write per resync)."""
    return dict(old) != dict(new)
