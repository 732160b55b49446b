"""Prometheus metrics of one sidecar and its ``/metrics`` + ``/healthz`` HTTP endpoint.

Each sidecar owns a private :class:`prometheus_client.CollectorRegistry` (so several sidecars in
one test process do not collide). Metric names:

* ``lifeline_sidecar_held_bytes{tier}`` — bytes held in memory per tier (L0 own, L1 replicas) and
  ``L2`` bytes persisted by this sidecar (a counter of bytes, as a gauge of the last round).
* ``lifeline_sidecar_replication_lag_steps`` — latest sealed step minus latest step whose every
  replica was acknowledged.
* ``lifeline_sidecar_persistence_lag_steps`` — latest step due for L2 minus latest persisted step.
* ``lifeline_sidecar_trainer_stall_seconds`` — histogram of the trainer's stall per save (as the
  trainer reported it: memcpy + handover + any backpressure wait).
* ``lifeline_sidecar_backpressure_wait_seconds`` — histogram of waits for a free slot.
* ``lifeline_sidecar_waiting_saves`` — trainer saves blocked right now waiting for a free slot.
* ``lifeline_sidecar_saves_total{outcome}`` — saves by outcome (``saved``, ``skipped``).
* ``lifeline_sidecar_errors_total{kind}`` — errors by kind (``auth``, ``peer``, ``checksum``,
  ``catalog``, ``storage``, ``memory``, ``protocol``).
* ``lifeline_sidecar_latest_step`` / ``lifeline_sidecar_latest_complete_step``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["SidecarMetrics", "serve_http"]

_STALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SidecarMetrics:
    """The metric objects of one sidecar, registered in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.held_bytes = Gauge("lifeline_sidecar_held_bytes", "Bytes held per tier", ["tier"], registry=r)
        self.replication_lag = Gauge(
            "lifeline_sidecar_replication_lag_steps", "Sealed step minus fully replicated step", registry=r
        )
        self.persistence_lag = Gauge(
            "lifeline_sidecar_persistence_lag_steps", "Step due for L2 minus persisted step", registry=r
        )
        self.stall = Histogram(
            "lifeline_sidecar_trainer_stall_seconds", "Trainer stall per save", buckets=_STALL_BUCKETS, registry=r
        )
        self.wait = Histogram(
            "lifeline_sidecar_backpressure_wait_seconds", "Wait for a free arena slot", buckets=_STALL_BUCKETS, registry=r
        )
        self.waiting = Gauge(
            "lifeline_sidecar_waiting_saves", "Trainer saves currently waiting for a free slot", registry=r
        )
        self.saves = Counter("lifeline_sidecar_saves_total", "Saves by outcome", ["outcome"], registry=r)
        self.errors = Counter("lifeline_sidecar_errors_total", "Errors by kind", ["kind"], registry=r)
        self.latest_step = Gauge("lifeline_sidecar_latest_step", "Latest sealed step of this rank", registry=r)
        self.latest_complete = Gauge(
            "lifeline_sidecar_latest_complete_step", "The job's latest complete step as last seen", registry=r
        )
        self.replicated_bytes = Counter("lifeline_sidecar_replicated_bytes_total", "Bytes sent to peers", registry=r)
        self.persisted_bytes = Counter("lifeline_sidecar_persisted_bytes_total", "Bytes written to L2", registry=r)
        for kind in ("auth", "peer", "checksum", "catalog", "storage", "memory", "protocol"):
            self.errors.labels(kind)
        for tier in ("L0", "L1"):
            self.held_bytes.labels(tier)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


def serve_http(host: str, port: int, metrics: SidecarMetrics, healthy: Callable[[], tuple[bool, str]]):
    """Serve ``/metrics`` and ``/healthz`` on (host, port) in a daemon thread; returns the server.

    ``healthy()`` returns ``(ok, detail)``; ``/healthz`` answers 200 ``ok`` or 503 with the detail.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server API)
            if self.path.startswith("/metrics"):
                body, code, ctype = metrics.render(), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/healthz"):
                ok, detail = healthy()
                body, code, ctype = (detail or "ok").encode(), (200 if ok else 503), "text/plain"
            else:
                body, code, ctype = b"not found", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sidecar-http", daemon=True).start()
    return server
