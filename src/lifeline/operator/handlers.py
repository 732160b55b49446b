"""The kopf handlers: thin glue from kopf's events to :func:`lifeline.operator.reconcile.reconcile`.

* one reconcile function for create, resume and spec updates;
* a timer (``LIFELINE_OPERATOR_RESYNC_SECONDS``, default 3 s) that compares the real pods,
  nodes and catalog with the spec and acts — failures are found here, not in watch events;
* a delete handler that drops the job's catalog keys (pods and the Secret are garbage
  collected through their ownerReferences).

Errors: an invalid spec is written as phase Failed and raised as ``kopf.PermanentError``
(never retried); API-server and Redis errors become ``kopf.TemporaryError`` with a delay,
retried with kopf's bounded back-off.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
import kubernetes

from lifeline.api.trainingjob import GROUP, PLURAL, VERSION
from lifeline.errors import CatalogError, LifelineError
from lifeline.operator import events, metrics
from lifeline.operator.reconcile import Env, forget_job, reconcile
from lifeline.operator.settings import OperatorSettings
from lifeline.operator.spec import REASON_INVALID_SPEC, InvalidSpec

__all__ = ["ENV_KEY", "reconcile_handler", "resync_handler", "delete_handler", "configure", "register_timer",
           "startup"]

log = logging.getLogger("lifeline.operator")

ENV_KEY = "lifeline_env"
"""Key of the :class:`~lifeline.operator.reconcile.Env` in kopf's ``memo``."""

_RETRIES = 20


def _env(memo: Any) -> Env:
    return memo[ENV_KEY]


def _run(memo: Any, body: Any) -> None:
    env = _env(memo)
    meta = body.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    try:
        reconcile(env, body)
    except InvalidSpec as err:  # reconcile marked the job Failed (under the job's lock)
        events.record(body, REASON_INVALID_SPEC, err.message)
        metrics.RECONCILE_ERRORS.labels("InvalidSpec").inc()
        metrics.RECONCILES.labels(ns, name, "invalid_spec").inc()
        raise kopf.PermanentError(f"invalid TrainingJob: {err.message}") from err
    except CatalogError as err:
        _retry(ns, name, err)
        raise kopf.TemporaryError(f"catalog unavailable: {err}", delay=5) from err
    except LifelineError as err:
        _retry(ns, name, err)
        raise kopf.TemporaryError(str(err), delay=5) from err
    except Exception as err:  # noqa: BLE001 - API errors (ApiException, urllib3): retried with back-off
        _retry(ns, name, err)
        raise kopf.TemporaryError(f"{type(err).__name__}: {err}", delay=3) from err
    metrics.RECONCILES.labels(ns, name, "ok").inc()


def _retry(namespace: str, name: str, err: Exception) -> None:
    """Count a reconcile that raised and will be retried."""
    metrics.RECONCILE_ERRORS.labels(type(err).__name__).inc()
    metrics.RECONCILES.labels(namespace, name, "retry").inc()


def _running(status: Any, **_: Any) -> bool:
    return (status or {}).get("phase") not in ("Succeeded", "Failed")


@kopf.on.resume(GROUP, VERSION, PLURAL, retries=_RETRIES, backoff=2)
@kopf.on.create(GROUP, VERSION, PLURAL, retries=_RETRIES, backoff=2)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", retries=_RETRIES, backoff=2)
def reconcile_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create, resume or spec change: bring the job's pods and status in line with the spec."""
    _run(memo, body)


def resync_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Every resync period while the job runs: observe pods, nodes and the catalog; recover failures."""
    _run(memo, body)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True, retries=5, backoff=2)
def delete_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Drop the job's catalog keys (pods and Secret are owned by the job and garbage-collected)."""
    try:
        forget_job(_env(memo), body)
    except Exception as err:  # noqa: BLE001 - Redis down: the keys stay; the finalizer must not block deletion
        log.warning("could not drop the catalog keys of %s: %s", (body.get("metadata") or {}).get("name"), err)


def configure(settings: kopf.OperatorSettings) -> None:
    """Apply Lifeline's kopf settings.

    Progress and diff-base go to annotations (``kopf.lifeline.dev/...``) so ``.status`` holds
    only the TrainingJob status schema; handler errors are posted as events.
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.lifeline.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.lifeline.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.execution.max_workers = 8
    # A TrainingJob deleted while its resync timer runs keeps kopf's finalizer until kopf sees the
    # timer stopped, and kopf looks again only after this many seconds (default 60): deleting a job
    # would then hang for a minute. The timer's handler is short, so check every second.
    settings.background.cancellation_polling = 1.0


def register_timer(resync_seconds: float, registry: kopf.OperatorRegistry | None = None) -> None:
    """Register :func:`resync_handler` as a kopf timer every ``resync_seconds`` (only while the job
    is neither Succeeded nor Failed). Call once, before the operator starts."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=resync_seconds, initial_delay=resync_seconds, sharp=False,
               when=_running, registry=registry)(resync_handler)


def _kube_clients() -> tuple[Any, Any]:
    """CoreV1Api and CustomObjectsApi: in-cluster credentials when present, else ``KUBECONFIG``."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, build the API clients and the :class:`Env` (into ``memo``), serve metrics."""
    configure(settings)
    op: OperatorSettings = memo["lifeline_settings"]
    core, custom = _kube_clients()
    memo[ENV_KEY] = Env(core=core, custom=custom, settings=op)
    metrics.serve(op.metrics_port, op.bind_address)
    log.info("lifeline operator started: namespaces=%s redis=%s resync=%.1fs",
             op.namespaces or "all", op.redis_url, op.resync_seconds)
