"""The operator's Prometheus metrics (prometheus-client), served on ``/metrics``.

All metrics live in :data:`REGISTRY` (not the process-global default) so tests and embedded
uses can read them without collisions.

=========================================  =========  ============================================
``lifeline_operator_failures_total``       counter    failures detected, by ``kind`` (the class)
``lifeline_operator_recoveries_total``     counter    recoveries started, by ``action`` (ladder rung)
``lifeline_operator_recovery_seconds``     histogram  seconds from acting on a failure to resuming
``lifeline_operator_checkpoint_lag_steps`` gauge      step - latest complete step, per job
``lifeline_operator_straggler_ranks``      gauge      ranks flagged as stragglers in the job's current
                                                      generation, per job (docs/stragglers.md)
``lifeline_operator_reconcile_seconds``    histogram  duration of one reconcile (observe+decide+act)
``lifeline_operator_reconcile_errors_total`` counter  reconciles that raised, by ``error`` class
``lifeline_operator_reconciles_total``     counter    reconciles of each job, by ``outcome``: ``ok``,
                                                      ``invalid_spec`` (marked Failed, not retried)
                                                      or ``retry`` (raised; kopf retries it)
=========================================  =========  ============================================

``reconciles_total`` is how a retry loop shows: a job whose ``retry`` count keeps growing, or
whose ``invalid_spec`` count passes 1 (tests/operator/test_hostile_specs.py asserts neither
happens for hostile specs).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = [
    "REGISTRY",
    "FAILURES",
    "RECOVERIES",
    "RECOVERY_SECONDS",
    "CHECKPOINT_LAG",
    "STRAGGLER_RANKS",
    "RECONCILE_SECONDS",
    "RECONCILE_ERRORS",
    "RECONCILES",
    "serve",
]

REGISTRY = CollectorRegistry(auto_describe=True)

FAILURES = Counter(
    "lifeline_operator_failures_total", "Failures detected, by kind.", ["namespace", "job", "kind"], registry=REGISTRY
)
RECOVERIES = Counter(
    "lifeline_operator_recoveries_total",
    "Recoveries started, by recovery ladder rung.",
    ["namespace", "job", "action"],
    registry=REGISTRY,
)
RECOVERY_SECONDS = Histogram(
    "lifeline_operator_recovery_seconds",
    "Seconds from acting on a failure until training resumed.",
    ["action"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
    registry=REGISTRY,
)
CHECKPOINT_LAG = Gauge(
    "lifeline_operator_checkpoint_lag_steps",
    "Steps between the trainers' step and the latest complete checkpoint.",
    ["namespace", "job"],
    registry=REGISTRY,
)
STRAGGLER_RANKS = Gauge(
    "lifeline_operator_straggler_ranks",
    "Ranks flagged as stragglers in the job's current generation (status.stragglers).",
    ["namespace", "job"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "lifeline_operator_reconcile_seconds",
    "Duration of one reconcile: observe, decide, act, write status.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "lifeline_operator_reconcile_errors_total", "Reconciles that raised, by error class.", ["error"], registry=REGISTRY
)

RECONCILES = Counter(
    "lifeline_operator_reconciles_total",
    "Reconciles of each job, by outcome: ok, invalid_spec (marked Failed) or retry (raised, retried).",
    ["namespace", "job", "outcome"],
    registry=REGISTRY,
)


def serve(port: int, addr: str = "0.0.0.0"):
    """Serve ``/metrics`` of :data:`REGISTRY` on ``addr:port`` in a daemon thread.

    Returns:
        The HTTP server (call ``shutdown()`` to stop it), or ``None`` when ``port < 0`` (disabled).
    """
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
    return server
