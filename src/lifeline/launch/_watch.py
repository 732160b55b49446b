"""Keep a local run's servers up, as a kubelet keeps a Redis or MinIO pod running.

:class:`ServiceWatch` looks at the servers ``lifeline run`` started once per supervision round. A dead
Redis is restarted at once on the same address — empty, like a Redis pod without persistence — and
the catalog is repaired (:func:`repair_catalog`); a dead MinIO is restarted on the same address and
data directory in the background, once a ``minio`` injection's outage is over.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lifeline.checkpoint import list_steps, read_manifest
from lifeline.errors import CatalogError, ClusterError, LifelineError
from lifeline.launch._observe import seed_l2_holdings

__all__ = ["ServiceWatch", "repair_catalog", "L2_STEPS_SEEDED"]

L2_STEPS_SEEDED = 2
"""After a catalog reset, the holdings of this many newest L2 checkpoints are recorded again (the
engine plans from the two newest multiples of ``persist.every``)."""


def repair_catalog(sup: Any) -> list[str]:
    """Write back what only the launcher knows into a catalog that lost its data (a restarted Redis):
    the job's ACL user (ranks connect as it), the current recovery plan (and with it the generation),
    the latest complete step it saw (it never moves backwards, and the sidecars that saw it may be
    gone with their nodes: fuzz seed 2 of ``--model pipelining-moe``) and the holdings of the newest
    L2 checkpoints. Sidecars re-register their own holdings (L0, L1)
    and re-advance the latest complete step themselves; each live sidecar gets the startup grace to do
    so (``registered_at`` cleared, the clock restarted), since none could beat while Redis was down.

    Args:
        sup: the :class:`~lifeline.launch.supervisor.Supervisor` (its catalog, services, record, pods).

    Returns:
        What was restored, one line each (for the run's events).

    Raises:
        CatalogError: Redis does not answer.
    """
    cat, done = sup.catalog, []
    services = sup.services
    if services.redis_job_password:
        cat.grant_job_user(services.redis_job_password)
        done.append("job ACL user")
    if sup.record.plan is not None:
        cat.put_plan(sup.record.plan)
        done.append(f"plan of generation {sup.record.plan.generation}")
    highest = sup.tally.complete_highest  # never backwards, even when the sidecars that saw it are gone
    if highest is not None and highest >= 0:
        cat.restore_complete_step(highest)
        done.append(f"latest complete step {highest}")
    found = services.storage()
    if found is not None:
        steps = list_steps(found[0], found[1], sup.name)[-L2_STEPS_SEEDED:]
        for step in steps:
            seed_l2_holdings(cat, read_manifest(found[0], found[1], sup.name, step))
        if steps:
            done.append(f"L2 holdings of steps {steps}")
    now = time.time()
    for pod in sup.pods.values():
        if pod.exit_code("sidecar") is None:
            pod.registered_at = None
            pod.sidecar_started_at = now
    return done


class ServiceWatch:
    """Restarts the run's crashed servers (see the module docstring).

    Args:
        sup: the supervisor (its ``services``, ``faults`` and ``_event`` are used).
    """

    def __init__(self, sup: Any) -> None:
        self.sup = sup
        self.restarts: dict[str, int] = {}
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    def tick(self) -> None:
        """Look at every server once: restart Redis (then repair the catalog); start MinIO's restart."""
        services = self.sup.services
        if services is None:
            return
        for server in list(services.servers):
            with self._lock:
                if server.name in self._busy or server.running:
                    continue
            if server.name == "redis":
                self._restart_redis(server)
            elif server.name == "minio":  # in the background, after the outage: the rounds go on, and
                with self._lock:              # the restart happens even if the run ends meanwhile
                    self._busy.add(server.name)
                until = self.sup.faults.minio_down_until if self.sup.faults is not None else None
                t = threading.Thread(target=self._restart_minio, args=(server, until), daemon=True,
                                     name="minio-restart")
                self._threads.append(t)
                t.start()

    def close(self, timeout: float = 60.0) -> None:
        """Start no other restart (one waiting out an outage gives up) and let one under way finish
        (at most ``timeout`` seconds), so that no server outlives the run."""
        self._closed.set()
        for t in self._threads:
            t.join(timeout)

    def _restart_redis(self, server: Any) -> None:
        t0 = time.time()
        try:
            server.restart()
            done = repair_catalog(self.sup)
        except (ClusterError, CatalogError, LifelineError, OSError) as err:
            self.sup._event(f"Redis restart failed, retrying: {err}")
            return
        self.restarts["redis"] = self.restarts.get("redis", 0) + 1
        self.sup._event(f"Redis was down: restarted empty in {time.time() - t0:.2f} s; restored {', '.join(done)}")

    def _restart_minio(self, server: Any, until: float | None) -> None:
        if until is not None and self._closed.wait(max(0.0, until - time.time())):
            return
        t0 = time.time()
        try:
            if self._closed.is_set():
                return
            server.restart()
            self.restarts["minio"] = self.restarts.get("minio", 0) + 1
            self.sup._event(f"MinIO was down: restarted in {time.time() - t0:.2f} s")
        except (ClusterError, OSError) as err:
            self.sup._event(f"MinIO restart failed, retrying: {err}")
        finally:
            with self._lock:
                self._busy.discard(server.name)
            if self.sup.faults is not None:
                self.sup.faults.minio_down_until = None
