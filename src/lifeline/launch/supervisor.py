"""Run a TrainingJob as local processes, kept alive by the operator's decision engine (docs/launch.md).

:class:`Supervisor` is the embedded default of Lifeline (``lifeline run JOB.yaml``): per rank one
sidecar and one trainer process on a local "node" (its own loopback address), the Redis catalog and
the L2 store as real servers. Every round (``poll_seconds``, or at once when a process exits) it reads
the catalog once, gathers what it sees (:func:`lifeline.launch._observe.observed_of`), asks
:func:`lifeline.control.decide` — the operator's engine, same rules and timeouts from
``spec.recovery`` — and applies the plan: publish it in the catalog (survivors rejoin in their
processes), restart dead trainers in place, replace lost "pods" on other nodes, or change the layout
(``Reshard``: shrink when lost ranks find no room, grow back when a lost node returns; the pods of
ranks in both layouts stay and read the restore step from the sidecars' memory, see :mod:`._elastic`).
A run whose L2 store holds the job's checkpoints resumes from the latest one (generation 1, resharded
when the spec's layout changed).
"""

from __future__ import annotations

import secrets as _secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lifeline.api import RecoveryAction, RecoveryPlan, TrainingJob
from lifeline.catalog import Catalog, CatalogView
from lifeline.control import Decision, NodeState, Progress, Record, Settle, decide
from lifeline.errors import CatalogError, ClusterError, RecoveryError
from lifeline.launch._apply import STUCK_SECONDS, _Applying
from lifeline.launch._elastic import NodeReturns, Retiring
from lifeline.launch._fleet import Fleet
from lifeline.launch._health import NodeHealth
from lifeline.launch._holds import fire_due
from lifeline.launch._observe import observed_of, quiet
from lifeline.launch._pods import Pod
from lifeline.launch._records import LaunchOptions, RecoveryRecord, Snapshot, Tally
from lifeline.launch._resume import final_digest, resume_plan
from lifeline.launch._stragglers import StragglerWatch
from lifeline.launch._wait import ExitWaiter
from lifeline.launch._watch import ServiceWatch
from lifeline.launch.env import Secrets
from lifeline.launch.faults import Faults
from lifeline.launch.inject import Injection
from lifeline.launch.services import Services, start_services

__all__ = ["LaunchOptions", "RecoveryRecord", "Snapshot", "Supervisor", "CATALOG_OUTAGE_SECONDS", "STUCK_SECONDS", "RECENT_STEPS"]

CATALOG_OUTAGE_SECONDS = 120.0
"""The supervisor keeps going through Redis timeouts this long (trainers and sidecars tolerate
them too); longer, and the run fails with the ``CatalogError``."""

RECENT_STEPS = 64
"""Holdings of at most this many of the newest catalog steps are read each round."""


class Supervisor(_Applying):
    """Runs one TrainingJob locally (see the module docstring).

    Args:
        job: a job validated by :func:`lifeline.launch.spec.load_for_launch`.
        options: :class:`LaunchOptions`.
        on_update: called with the :class:`Snapshot` after every round (the display).
    """

    def __init__(self, job: TrainingJob, options: LaunchOptions,
                 on_update: Callable[[Snapshot], None] | None = None) -> None:
        self.job = job
        self.name: str = job.name or ""
        self.options = options
        self.on_update = on_update
        self.layout = job.spec.layout
        self.state_dir = options.state_dir.resolve()
        self.log_dir = self.state_dir / "logs"
        world = self.layout.world_size
        spares = world if options.spare_nodes is None else options.spare_nodes
        self.nodes: dict[str, NodeState] = {f"node-{i}": NodeState(f"node-{i}", capacity=1)
                                            for i in range(world + spares)}
        self.secrets = Secrets(_secrets.token_hex(32))
        self.services: Services | None = None
        self.catalog: Catalog | None = None
        self.pods: dict[int, Pod] = {}
        self.record = Record()
        self.pending: list[Injection] = sorted(options.injections, key=lambda i: i.step)
        self.snapshot = Snapshot(self.name, job.spec.steps, self.layout)
        self.tally = Tally()
        self.straggling = StragglerWatch(job.spec.recovery.straggler)  # slow ranks (docs/stragglers.md)
        self.step_seconds, self.stall_seconds = self.tally.step_seconds, self.tally.stall_seconds
        self._failing_since: float | None = None
        self._injected_at: float | None = None
        self._fault_estimate: float | None = None  # the last step before a failure nobody injected
        self.faults: Faults | None = None
        self.watch = ServiceWatch(self)
        self.first_step_at: float | None = None
        self._spare_held = False  # a grow's step is spared in the sidecars' memory (Catalog.spare)
        self.resumed_from: int | None = None
        self.final_view: CatalogView | None = None
        self.digest: dict[str, Any] | None = None
        self.fleet: Fleet | None = None
        self._waiter = ExitWaiter()
        self._last_holdings: frozenset | None = None
        self._catalog_down_since: float | None = None
        self.retiring = Retiring()
        self.returns = NodeReturns(self.nodes, options.node_return_seconds)
        self.health = NodeHealth(job.spec.recovery.health_check, self.nodes, self.state_dir / "health",
                                 faults=options.unhealthy_nodes, event=self._event)  # docs/health.md

    @property
    def generation(self) -> int:
        """The current generation."""
        return self.record.generation

    @property
    def restarts(self) -> int:
        """Recoveries performed."""
        return self.record.restarts

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> str:
        """Start everything, supervise until every trainer finished or the job failed, stop.

        Returns:
            The final phase: ``Succeeded`` or ``Failed``.

        Raises:
            RecoveryError: ``timeout_seconds`` passed.
            ConfigError / ClusterError: services or processes could not start.
        """
        try:
            self._start()
            phase = self._supervise()
            self.snapshot.phase = phase
            self.health.finish()  # a node that came back late still gets its verdict
            if phase == "Succeeded":
                assert self.services is not None and self.catalog is not None
                persist = self.job.spec.checkpoint.persist
                self.digest = final_digest(self.catalog, self.services.storage(), self.name, self.job.spec.steps,
                                           persist.every if persist is not None else None)
            self._notify()
            return phase
        finally:
            self.close()

    def _start(self) -> None:
        self.services = start_services(self.job, self.state_dir, persist_uri=self.options.persist_uri,
                                       s3_endpoint=self.options.s3_endpoint)
        sv = self.services
        self.secrets = Secrets(self.secrets.hmac_key, sv.s3_access_key, sv.s3_secret_key,
                               sv.redis_job_username, sv.redis_job_password)
        self.catalog = sv.catalog(self.name, self.layout.world_size)
        start = self._resume_plan(generation=1, restarts=0)
        if start is not None:
            self.catalog.put_plan(start)
            self.record = Record(generation=start.generation, plan=start)
            self.resumed_from = start.restore_step
            self._event(f"resuming from L2 step {start.restore_step}: {start.reason}")
        # this run's faults hold the trainers afresh (a state dir run before keeps its releases)
        shutil.rmtree(self.state_dir / "holds", ignore_errors=True)
        first = self._check_health()
        self.fleet = Fleet(self.job, self.options, self.services, self.secrets, self.nodes, self.log_dir)
        self.pods = self.fleet.pods
        self.faults = Faults(self)
        if self.options.warm_start:
            self.fleet.warm(first)
            self._event(f"{len(self.fleet.pool.spares)} spares ready")
        self.fleet.await_templates()  # the first ranks fork from them (fresh processes without)
        for rank, node in first.items():  # the spares stay for failures
            self._create_pod(rank, node, spares=False)
        self._write_pids()

    def _nodes_back(self, now: float) -> None:
        """Lost nodes whose time is up come back: Ready at once, or once their health check passed."""
        for node in self.returns.due(now):
            if not self.health.back(node):
                self._event(f"{node} is Ready again")
        self.health.tick()

    def _check_health(self) -> dict[int, str]:
        """Run the nodes' health check when the spec asks for it (failed nodes: unschedulable) and
        return the first placement: rank ``r`` on the ``r``-th usable node by index.

        Raises:
            ClusterError: fewer nodes passed than the world size.
        """
        self.health.check_all()
        usable = sorted((n for n, st in self.nodes.items() if st.schedulable), key=lambda n: int(n.rsplit("-", 1)[1]))
        world = self.layout.world_size
        if len(usable) < world:
            failed = (self.health.summary or {}).get("failed", {})
            raise ClusterError(f"only {len(usable)} of {len(self.nodes)} nodes passed the health check and the job "
                               f"needs {world}: {failed}; fix the nodes or add spares (--spare-nodes)", job=self.name)
        return {rank: usable[rank] for rank in range(world)}

    def close(self) -> None:
        """Stop every process and server this supervisor started (idempotent)."""
        self.retiring.release()
        if self.fleet is not None:
            self.fleet.close()
        self.watch.close()  # a MinIO restart under way finishes before the servers stop
        self._waiter.close()
        if self.catalog is not None:
            try:
                self.catalog.close()
            except Exception:  # noqa: BLE001
                pass
            self.catalog = None
        if self.services is not None:
            self.services.stop()
            self.services = None

    def _resume_plan(self, *, generation: int, restarts: int) -> RecoveryPlan | None:
        assert self.services is not None and self.catalog is not None
        found = self.services.storage()
        if found is None:
            return None
        return resume_plan(self.catalog, found[0], found[1], self.name, self.layout, generation=generation,
                           restarts=restarts)

    # ------------------------------------------------------------------ pods
    def _create_pod(self, rank: int, node: str, *, spares: bool = True) -> Pod:
        assert self.fleet is not None
        return self.fleet.create_pod(rank, node, layout=self.layout, generation=self.generation, spares=spares)

    def _restart_trainer(self, pod: Pod) -> None:
        assert self.fleet is not None
        self.fleet.restart_trainer(pod)

    def _refill_spares(self) -> None:
        """Keep the pool full (one spare started at a time). Not before the first step, nor while a
        failure is pending or a recovery has not caught up (warming would take CPU from them)."""
        if self.fleet is None or self.options.spares_per_node <= 0 or self.first_step_at is None \
                or self.snapshot.phase != "Running" or self._failing_since is not None:
            return
        recs = self.snapshot.recoveries
        if recs and recs[-1].caught_up_at is None:
            return
        self.fleet.refill(self.record.cool_downs)

    def _write_pids(self) -> None:
        if self.fleet is not None:
            self.fleet.write_pids(self.state_dir / "processes.json")

    # ------------------------------------------------------------------ supervision
    def _supervise(self) -> str:
        deadline = None if self.options.timeout_seconds is None else time.monotonic() + self.options.timeout_seconds
        last_pids = 0.0
        while True:
            self.watch.tick()  # a crashed Redis or MinIO comes back (docs/launch.md, "Services")
            now = time.time()
            view = self._read_catalog(now)
            if view is None:  # Redis did not answer this round: look again (what the operator does)
                self._wait_round(self.options.poll_seconds)
                continue
            self.tally.observe(view, self.snapshot, self.layout)
            self.straggling.round(self, view)
            if self.first_step_at is None and self.snapshot.step > 0:
                self.first_step_at = time.time()
            self._inject(view)
            self._nodes_back(now)
            d = self._decide(view, now)
            if d.phase == "Succeeded":
                self.final_view = self._read_catalog(time.time()) or view
                return "Succeeded"
            if d.plan is not None and d.plan.action is RecoveryAction.GIVE_UP:
                self._event(f"giving up: {d.plan.reason}")
                return "Failed"
            if d.plan is not None and self._spared(d.plan):
                noticed, self._failing_since = self._failing_since, None
                self._apply(d.plan, view, now, noticed)
            self._last_holdings = view.holdings
            self._restart_stuck(view)
            self._close_recoveries(view)
            self._release_spare()  # the restore read what a grow spared: the sidecars may evict it
            self._refill_spares()
            self._notify()
            if now - last_pids > 1.0:
                self._write_pids()
                last_pids = now
            if deadline is not None and time.monotonic() > deadline:
                raise RecoveryError(f"the run did not finish within {self.options.timeout_seconds:.0f} s "
                                    f"(step {self.snapshot.step} of {self.job.spec.steps}); logs in {self.log_dir}",
                                    job=self.name, step=self.snapshot.step)
            settling = self._failing_since is not None  # a plan is near: look again soon
            self._wait_round(min(self.options.poll_seconds, 0.01) if settling else self.options.poll_seconds)

    def _decide(self, view: CatalogView, now: float) -> Decision:
        """One round of the engine: observe, settle, decide; keeps the record's phase."""
        observed = observed_of(self.pods, self.nodes, view, self.layout.world_size)
        since = self._failing_since if self._failing_since is not None else now
        d = decide(self.job.spec, self.record, observed, now=now, settle=Settle(since, quiet(view, self._last_holdings, self.pods, self._failing_since, now)))
        if d.failures and self._fault_estimate is None:  # when it broke, for a failure nobody injected
            self._fault_estimate = self.tally.last_step_at or now
        if d.failures and d.plan is None:
            self._failing_since = since
        elif not d.failures:
            self._failing_since = None
            self._fault_estimate = None
        if d.plan is None and d.phase != self.record.phase:
            self.record = replace(self.record, phase=d.phase, reason=d.reason, message=d.message)
            self.snapshot.phase = d.phase
        if d.state_step != self.record.state_step:  # the engine's fallback if Redis comes back empty
            self.record = replace(self.record, state_step=d.state_step)
        return d

    def _read_catalog(self, now: float) -> CatalogView | None:
        """This round's catalog view; ``None`` while Redis does not answer, for at most
        :data:`CATALOG_OUTAGE_SECONDS` in a row (a loaded Redis can miss the client's 5 s timeout).

        Raises:
            CatalogError: Redis has not answered for longer than that.
        """
        assert self.catalog is not None
        persist = self.job.spec.checkpoint.persist
        try:
            view = self.catalog.view(recent_steps=RECENT_STEPS, persist_every=persist.every if persist else 0)
        except CatalogError as err:
            if self._catalog_down_since is None:
                self._catalog_down_since = now
                self._event(f"catalog unavailable, retrying: {err}")
            if now - self._catalog_down_since > CATALOG_OUTAGE_SECONDS:
                raise
            return None
        self._catalog_down_since = None
        for rank, pod in self.pods.items():  # (a lost or replaced pod's registration does not count)
            reg = view.registrations.get(rank)
            if reg is not None and reg.node == pod.node and pod.exit_code("sidecar") is None \
                    and reg.pid in (0, pod.pids().get("sidecar")):
                pod.registered_at = now
        return view

    def _wait_round(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: a process exit wakes the round."""
        self._waiter.wait(self.fleet.processes() if self.fleet is not None else [], seconds)

    def _inject(self, view: CatalogView) -> None:
        """Fire the injections due (:func:`lifeline.launch._holds.fire_due`: held ones first, then the
        fallback and ``when=recovery`` ones on the reported steps) and release their holds; one at the
        last step once every other rank reported ``done`` in ``view``."""
        assert self.faults is not None
        recs = self.snapshot.recoveries
        recovering = bool(recs) and recs[-1].resumed_at is None
        hold_dir = self.fleet.hold_dir if self.fleet is not None else None
        finished = {rank for rank, rec in view.reports.items() if rec.event == "done"}
        for fired in fire_due(self.faults, self.pending, self.tally.seen_step, recovering=recovering,
                              hold_dir=hold_dir, event=self._event, last_step=self.job.spec.steps,
                              finished=finished, world_size=self.layout.world_size):
            if fired.recovers:  # time lost counts from here (service faults call for no recovery)
                self._injected_at = self._injected_at or fired.at

    def _close_recoveries(self, view: CatalogView) -> None:
        if not self.snapshot.recoveries:
            return
        rec = self.snapshot.recoveries[-1]
        world = self.layout.world_size
        progress = Progress.of(view.reports.values(), view.generation)
        if rec.resumed_at is None and view.generation >= self.generation and progress.trained_in(self.generation, world):
            rec.resumed_at = time.time()
            if self.retiring.pods:
                self._event(f"stopped the pods of ranks {self.retiring.release()} (out of the layout)")
            self.record = replace(self.record, phase="Running", reason="Recovered")
            self.snapshot.phase = "Running"
            self._event(f"generation {rec.generation} resumed training after {rec.seconds:.2f} s")
        if rec.caught_up_at is None and progress.caught_up(rec.generation, world, rec.from_step):
            rec.caught_up_at = time.time()

    # ------------------------------------------------------------------ display
    def _event(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.snapshot.events.append(f"{stamp} {text}")

    def _notify(self) -> None:
        if self.on_update is not None:
            self.on_update(self.snapshot)

