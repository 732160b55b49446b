"""Run a TrainingJob as local processes and keep it alive with the operator's decisions.

:class:`Supervisor` is the embedded default of Lifeline (``lifeline run JOB.yaml``): per rank
one sidecar and one trainer process on a local "node" (its own loopback address), the Redis
catalog and the L2 store as real servers. Every round (``poll_seconds``) it observes what the
operator observes — process exits (container terminations), lost "nodes", sidecar heartbeats,
step progress and reported collective errors from the catalog — turns them into
:mod:`lifeline.control` signals, and when :func:`lifeline.control.classify` finds failures,
applies the plan of :func:`lifeline.control.plan_recovery`:

* publish the plan in the catalog (``plan:<generation>``), so surviving trainers rejoin the new
  generation in their processes and restore the planned step;
* ``RestartInPlace``/``Rollback``: start the dead trainers again on their node (their sidecar
  kept L0);
* ``ReplacePods``: stop what is left of the lost ranks and start sidecar and trainer on the
  planned node with a fresh arena; the trainer restores from a peer's L1 copy;
* ``Reshard``: stop every rank and start the new layout from the latest L2 checkpoint (the
  universal format reshards on load);
* ``GiveUp``: stop, phase Failed.

A run whose state dir's L2 store already holds checkpoints of the job resumes from the latest
one (generation 1, restore from L2, resharded when the spec's layout changed).
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lifeline.api import LayoutSpec, RecoveryAction, TrainingJob
from lifeline.control import (
    ClusterState,
    CollectiveErrorReported,
    ContainerTerminated,
    Failure,
    HeartbeatExpired,
    JobState,
    NodeCondition,
    NodeState,
    PodPlacement,
    RecoveryPlan,
    RestoreSource,
    Signal,
    StepStalled,
    classify,
    plan_recovery,
)
from lifeline.errors import RecoveryError
from lifeline.launch._observe import CatalogView, plan_document, read_catalog, seed_l2_holdings, tier_steps
from lifeline.launch._pods import Pod
from lifeline.launch._records import LaunchOptions, RecoveryRecord, Snapshot
from lifeline.launch.env import Secrets, node_ip, rank_processes
from lifeline.launch.inject import Injection
from lifeline.launch.services import Services, start_services
from lifeline.launch.spares import SparePool, spare_env
from lifeline.operator.decide import HEARTBEAT_GRACE_SECONDS

__all__ = ["LaunchOptions", "RecoveryRecord", "Snapshot", "Supervisor", "COLLECTIVE_GRACE_SECONDS", "SETTLE_SECONDS",
           "MIN_SETTLE_SECONDS", "CATALOG_OUTAGE_SECONDS", "STRAGGLER_SECONDS"]

SETTLE_SECONDS = 1.0
"""Planning waits at most this long after the first failure signal, so the copies in flight reach
the catalog first: the dead rank's last save is still being sealed by its sidecar, and survivors
finish the step they are in (and may evict an older step) before they block. A plan made on the
settled holdings names a step every rank still holds."""

MIN_SETTLE_SECONDS = 0.05
"""Planning waits at least this long, and then only until the job is quiet: every live trainer
has reported a collective failure in the current generation (it is blocked, it saves nothing
more) and the catalog's holdings did not change between two rounds (the last seals are filed).
The wait ends at :data:`SETTLE_SECONDS` in any case (a hang, a sidecar failure: nobody reports)."""

CATALOG_OUTAGE_SECONDS = 120.0
"""The supervisor keeps going through Redis timeouts this long (trainers and sidecars tolerate
them too); longer, and the run fails with the ``CatalogError``."""

STRAGGLER_SECONDS = 1.5
"""A surviving trainer that has not read the plan this long after it was published (its latest
report is neither the runtime's ``plan`` report of this generation nor of a newer generation) is
stuck — in a collective of the old group, or frozen:
gloo cannot abort it, and a peer that left may not wake it (seen: a ``recv`` from a rank that had
torn its group down waited out the whole collective timeout). It is killed and restarted in place
— in its node's spare — within the same plan (TorchFT kills a process group it cannot abort too)."""

COLLECTIVE_GRACE_SECONDS = 3.0
"""A reported collective error alone becomes a failure only after this long: when a rank dies,
its peers report collective errors at once, and the dead process is the cause to act on."""


class Supervisor:
    """Runs one TrainingJob locally (see the module docstring).

    Args:
        job: a job validated by :func:`lifeline.launch.spec.load_for_launch`.
        options: :class:`LaunchOptions`.
        on_update: called with the :class:`Snapshot` after every round (the display).
    """

    def __init__(self, job: TrainingJob, options: LaunchOptions,
                 on_update: Callable[[Snapshot], None] | None = None) -> None:
        self.job = job
        self.name: str = job.name  # type: ignore[assignment]
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
        self.catalog: Any = None
        self.pods: dict[int, Pod] = {}
        self.generation = 0
        self.restarts = 0
        self.cool_downs: dict[str, float] = {}
        self.pending: list[Injection] = sorted(options.injections, key=lambda i: i.step)
        self.snapshot = Snapshot(self.name, job.spec.steps, self.layout)
        self.step_seconds: dict[tuple[int, int, int], float] = {}
        self.stall_seconds: dict[tuple[int, int, int], float] = {}
        self._collective_seen: dict[int, float] = {}
        self._seen_step: dict[int, int] = {}
        self._acted_at = 0.0
        self._failing_since: float | None = None
        self._injected_at: float | None = None
        self.first_step_at: float | None = None
        self.resumed_from: int | None = None
        self.final_view: CatalogView | None = None
        self.digest: dict[str, Any] | None = None
        self.pool: SparePool | None = None
        self._pidfds: dict[int, tuple[int, Any]] = {}
        self._last_holdings: frozenset | None = None
        self._catalog_down_since: float | None = None

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
            if phase == "Succeeded":
                self.digest = self._digest()
            self._notify()
            return phase
        finally:
            self.close()

    def _digest(self) -> dict[str, Any]:
        """Digest of the final checkpoint: of the consolidated L2 state when the last step is
        persisted (awaited up to 120 s), else of the catalog's chunk checksums."""
        from lifeline.launch.summary import await_l2_step, checksum_digest, state_digest

        assert self.services is not None
        step = self.job.spec.steps
        persist = self.job.spec.checkpoint.persist
        found = self.services.storage()
        if found is not None and persist is not None and step % persist.every == 0:
            storage, prefix = found
            if await_l2_step(storage, prefix, self.name, step, 120.0):
                from lifeline.checkpoint import consolidate

                tensors = consolidate(storage, prefix, self.name, step)
                return {"sha256": state_digest(tensors), "source": "L2", "step": step}
        return {"sha256": checksum_digest(self.catalog.metas(step)), "source": "checksums", "step": step}

    def _start(self) -> None:
        from lifeline.sidecar.catalog import Catalog

        self.services = start_services(self.job, self.state_dir, persist_uri=self.options.persist_uri,
                                       s3_endpoint=self.options.s3_endpoint)
        self.secrets = Secrets(self.secrets.hmac_key, self.services.s3_access_key, self.services.s3_secret_key)
        self.catalog = Catalog(self.services.redis_url, self.name, self.layout.world_size)
        start_plan = self._resume_plan()
        if start_plan is not None:
            self.catalog.put_plan(start_plan.generation, plan_document(start_plan))
            self.generation = start_plan.generation
            self._event(f"resuming from L2 step {start_plan.restore_step}: {start_plan.reason}")
        first = self._rank_spec(0, "node-0")
        self.pool = SparePool({"trainer": spare_env(first.trainer), "sidecar": spare_env(first.sidecar)},
                              self.log_dir)
        if self.options.warm_start:
            self._warm_pool()
        for rank in range(self.layout.world_size):  # fresh processes: the spares stay for failures
            self._create_pod(rank, f"node-{rank}", spares=False)
        self._write_pids()

    def _warm_pool(self) -> None:
        """Start every spare the ranks' nodes and the standby nodes want, and wait until all are ready.

        Raises:
            ClusterError: a spare exited before it was ready (its log names why).
        """
        from lifeline.errors import ClusterError

        assert self.pool is not None
        wanted = self._wanted_spares({r: f"node-{r}" for r in range(self.layout.world_size)})
        while self.pool.fill(wanted, max_warming=None) is not None:
            pass
        deadline = time.monotonic() + 600
        while not all(s.ready() for s in self.pool.spares):
            if any(not s.alive() for s in self.pool.spares):
                raise ClusterError(f"a spare process exited while importing; see {self.log_dir}/spare-*.log")
            if time.monotonic() > deadline:
                raise ClusterError("spares not ready within 600 s", job=self.name)
            time.sleep(0.05)
        self._event(f"{len(self.pool.spares)} spares ready")

    def close(self) -> None:
        """Stop every process and server this supervisor started (idempotent)."""
        from lifeline.launch._pods import stop_all

        if self.pool is not None:
            self.pool.close()
        stop_all(list(self.pods.values()))
        self.pods.clear()
        for fd, _ in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        if self.catalog is not None:
            try:
                self.catalog.close()
            except Exception:  # noqa: BLE001
                pass
            self.catalog = None
        if self.services is not None:
            self.services.stop()
            self.services = None

    # ------------------------------------------------------------------ resume from L2
    def _resume_plan(self) -> RecoveryPlan | None:
        """A generation-1 plan restoring the latest L2 checkpoint of this job, if storage has one."""
        from lifeline.checkpoint import list_steps, read_manifest

        assert self.services is not None
        found = self.services.storage()
        if found is None:
            return None
        storage, prefix = found
        steps = list_steps(storage, prefix, self.name)
        if not steps:
            return None
        manifest = read_manifest(storage, prefix, self.name, max(steps))
        seed_l2_holdings(self.catalog, manifest)
        saved = LayoutSpec(**manifest.layout.to_dict())
        self.resumed_from = manifest.step
        world = self.layout.world_size
        action = RecoveryAction.ROLLBACK if saved == self.layout else RecoveryAction.RESHARD
        return RecoveryPlan(
            action=action, generation=1, restarts=0, restore_step=manifest.step, layout=self.layout,
            node_of_rank=tuple(f"node-{r}" for r in range(world)), restore_ranks=tuple(range(world)),
            sources=tuple(RestoreSource(r, "L2", None, None) for r in range(saved.world_size)),
            restart_ranks=(), create_pods=tuple(PodPlacement(r, f"node-{r}") for r in range(world)),
            delete_ranks=(), cool_downs=(), failures=(),
            reason=f"the L2 store holds step {manifest.step} of {self.name} in layout {saved.to_wire()}; "
                   + ("restoring it" if action is RecoveryAction.ROLLBACK
                      else f"resharding it to layout {self.layout.to_wire()}"),
        )

    # ------------------------------------------------------------------ pods
    def _create_pod(self, rank: int, node: str, *, spares: bool = True) -> Pod:
        pod = Pod(self._rank_spec(rank, node), self.generation, self.log_dir)
        pod.start_sidecar(self._spare(node, "sidecar") if spares else None)
        pod.start_trainer(self._spare(node, "trainer") if spares else None)
        self.pods[rank] = pod
        return pod

    def _rank_spec(self, rank: int, node: str):
        assert self.services is not None
        index = int(node.rsplit("-", 1)[1])
        env = {"LIFELINE_SLOT_BYTES": str(self.options.slot_bytes), **self.options.extra_env}
        if self.services.persist_uri and self.job.spec.checkpoint.persist is not None:
            # the trainer reads L2 itself only to reshard a checkpoint of another layout
            env["LIFELINE_PERSIST_URI"] = self.services.persist_uri
            if self.services.s3_endpoint:
                env.update(LIFELINE_S3_ENDPOINT=self.services.s3_endpoint,
                           LIFELINE_S3_ACCESS_KEY=self.services.s3_access_key,
                           LIFELINE_S3_SECRET_KEY=self.services.s3_secret_key)
        return rank_processes(
            self.job, rank, layout=self.layout, generation=self.generation, node=node, pod_ip=node_ip(index),
            arena_dir=self._arena_dir(rank, node), redis_url=self.services.redis_url, secrets=self.secrets,
            persist_uri=self.services.persist_uri, s3_endpoint=self.services.s3_endpoint, extra_env=env)

    def _spare(self, node: str, role: str):
        return None if self.pool is None else self.pool.take(node, role)

    def _refill_spares(self) -> None:
        """Keep the pool full (one spare started at a time): trainers on the nodes of the ranks,
        then sidecar + trainer on the standby nodes. Not while a failure is pending or a recovery
        has not caught up (warming would take CPU from it), nor before the first step."""
        n = self.options.spares_per_node
        if self.pool is None or n <= 0 or self.snapshot.phase != "Running" or self._failing_since is not None:
            return
        recs = self.snapshot.recoveries
        if recs and recs[-1].caught_up_at is None:
            return
        self.pool.fill(self._wanted_spares({r: p.node for r, p in self.pods.items()}))

    def _wanted_spares(self, node_of_rank: dict[int, str]) -> list[tuple[str, str, int]]:
        """``(node, role, count)`` in priority order: trainers on the ranks' nodes, then sidecar and
        trainer on the first ``standby_nodes`` free, ready nodes outside cool-down (by name, the
        order in which ``lifeline.control`` places replacements)."""
        n = self.options.spares_per_node
        if n <= 0:
            return []
        now = time.time()
        used = set(node_of_rank.values())
        free = sorted(name for name, node in self.nodes.items()
                      if name not in used and node.ready and self.cool_downs.get(name, 0.0) <= now)
        wanted = [(node_of_rank[r], "trainer", n) for r in sorted(node_of_rank)]
        for node in free[:self.options.standby_nodes]:
            wanted += [(node, "sidecar", n), (node, "trainer", n)]
        return wanted

    def _arena_dir(self, rank: int, node: str) -> Path:
        from lifeline.api.pod import default_arena_dir

        return default_arena_dir(self.name, rank).with_name(f"lifeline-{self.name}-{rank}-{node}")

    def _write_pids(self) -> None:
        assert self.services is not None
        doc = {"launcher": os.getpid(), **{f"{k}": v for k, v in self.services.pids().items()},
               "ranks": {str(r): p.pids() for r, p in self.pods.items()},
               "spares": [] if self.pool is None else self.pool.pids()}
        (self.state_dir / "processes.json").write_text(json.dumps(doc, indent=1))

    # ------------------------------------------------------------------ supervision
    def _supervise(self) -> str:
        deadline = None if self.options.timeout_seconds is None else time.monotonic() + self.options.timeout_seconds
        last_pids = 0.0
        while True:
            now = time.time()
            view = self._read_catalog(now)
            if view is None:  # Redis did not answer this round: look again (what the operator does)
                self._wait_round(self.options.poll_seconds)
                continue
            self._observe_progress(view)
            self._inject(view)
            if self._all_done():
                self.final_view = self._read_catalog(time.time()) or view
                return "Succeeded"
            failures = self._failures(view, now)
            if not failures:
                self._failing_since = None
            elif self._failing_since is None:
                self._failing_since = time.time()
            if failures and self._settled(view, now):
                noticed, self._failing_since = self._failing_since, None
                plan = self._plan(view, failures, now)
                if plan.action is RecoveryAction.GIVE_UP:
                    self._event(f"giving up: {plan.reason}")
                    return "Failed"
                self._apply(plan, view, now, noticed)
            self._last_holdings = view.holdings
            self._restart_stragglers(view)
            self._close_recoveries(view)
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

    def _read_catalog(self, now: float) -> CatalogView | None:
        """This round's catalog view; ``None`` while Redis does not answer, for at most
        :data:`CATALOG_OUTAGE_SECONDS` in a row (a loaded Redis can miss the client's 5 s timeout).

        Raises:
            CatalogError: Redis has not answered for longer than that.
        """
        from lifeline.errors import CatalogError

        try:
            view = read_catalog(self.catalog, self.layout.world_size)
        except CatalogError as err:
            if self._catalog_down_since is None:
                self._catalog_down_since = now
                self._event(f"catalog unavailable, retrying: {err}")
            if now - self._catalog_down_since > CATALOG_OUTAGE_SECONDS:
                raise
            return None
        self._catalog_down_since = None
        return view

    def _wait_round(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: a pidfd per running process wakes the round when one exits."""
        live: dict[int, Any] = {}
        for pod in self.pods.values():
            for proc in (pod.trainer, pod.sidecar):
                if proc is not None and proc.returncode is None:
                    live[proc.pid] = proc
        for pid in [p for p in self._pidfds if p not in live or self._pidfds[p][1] is not live[p]]:
            os.close(self._pidfds.pop(pid)[0])
        for pid, proc in live.items():
            if pid not in self._pidfds:
                try:
                    self._pidfds[pid] = (os.pidfd_open(pid), proc)
                except (AttributeError, OSError):  # no pidfds (old kernel): the round's sleep still bounds it
                    continue
        fds = [fd for fd, _ in self._pidfds.values()]
        if fds:
            select.select(fds, [], [], seconds)
        else:
            time.sleep(seconds)

    def _settled(self, view: CatalogView, now: float) -> bool:
        """Whether to plan now (see :data:`MIN_SETTLE_SECONDS` and :data:`SETTLE_SECONDS`)."""
        assert self._failing_since is not None
        waited = now - self._failing_since
        if waited >= SETTLE_SECONDS:
            return True
        if waited < MIN_SETTLE_SECONDS or view.holdings != self._last_holdings:
            return False
        blocked = {rank for rank, _ in view.progress.failures}
        live = {rank for rank, pod in self.pods.items() if pod.exit_code("trainer") is None}
        return live <= blocked

    def _all_done(self) -> bool:
        return all(p.exit_code("trainer") == 0 for p in self.pods.values())

    def _observe_progress(self, view: CatalogView) -> None:
        snap = self.snapshot
        snap.generation = view.generation
        snap.step = view.progress.step
        snap.tiers = tier_steps(view.holdings, self.layout.world_size)
        if snap.phase == "Pending" and view.progress.step > 0:
            snap.phase = "Running"
            self.first_step_at = time.time()
        for rank, rec in view.reports.items():
            key = (int(rec.get("generation", 0)), rank, int(rec.get("step") or 0))
            if rec.get("event") == "step":
                if rec.get("seconds") is not None:
                    self.step_seconds.setdefault(key, float(rec["seconds"]))
                if rec.get("loss") is not None:
                    snap.loss = float(rec["loss"])
                if rec.get("tokens_per_s") is not None and rank == 0:
                    snap.tokens_per_s = float(rec["tokens_per_s"]) * self.layout.data
            elif rec.get("event") == "save" and rec.get("seconds") is not None:
                self.stall_seconds.setdefault(key, float(rec["seconds"]))
            if rec.get("event") in ("step", "save", "done"):
                self._seen_step[rank] = max(self._seen_step.get(rank, 0), int(rec.get("step") or 0))

    def _inject(self, view: CatalogView) -> None:
        for inj in list(self.pending):
            pod = self.pods.get(inj.rank)
            if pod is None or self._seen_step.get(inj.rank, 0) < inj.step:
                continue
            self.pending.remove(inj)
            self._injected_at = self._injected_at or time.time()
            self._event(f"injecting {inj} (rank {inj.rank} at step {self._seen_step.get(inj.rank)})")
            if inj.kind in ("trainer", "node"):
                pod.kill("trainer")
            if inj.kind in ("sidecar", "node"):
                pod.kill("sidecar")
            if inj.kind == "node":
                self.nodes[pod.node] = NodeState(pod.node, ready=False, capacity=1)
            if inj.kind == "hang":
                pod.hang()

    def _failures(self, view: CatalogView, now: float) -> tuple[Failure, ...]:
        signals: list[Signal] = []
        for rank, pod in self.pods.items():
            for role in ("trainer", "sidecar"):
                code = pod.exit_code(role)
                if code is None or role in pod.handled:
                    continue
                if role == "trainer" and code == 0:
                    continue
                if role == "sidecar" and pod.exit_code("trainer") == 0 and self._all_done():
                    continue
                exit_code = 128 - code if code < 0 else code  # as the kubelet reports a signal: 137 = SIGKILL
                signals.append(ContainerTerminated(rank, pod.node, role, exit_code,
                                                   "Killed" if code < 0 else "Error"))
            if rank in view.registered and view.registered_nodes.get(rank, pod.node) in (pod.node, ""):
                pod.registered_at = now  # (a lost pod's registration on its old node does not count)
            elif pod.registered_at is not None and pod.exit_code("sidecar") is None \
                    and now - pod.registered_at > HEARTBEAT_GRACE_SECONDS:
                signals.append(HeartbeatExpired(rank, pod.node, now - pod.registered_at))
        used = {p.node for p in self.pods.values()}
        signals += [NodeCondition(n, False) for n in sorted(used) if not self.nodes[n].ready]
        if view.progress.last_time is not None:  # a recovery restarts the hang clock
            since = max(view.progress.last_time, self._acted_at)
            signals.append(StepStalled(view.progress.step, max(0.0, now - since)))
        if view.generation == self.generation:
            for rank, detail in view.progress.failures:
                first = self._collective_seen.setdefault(rank, now)
                if now - first >= COLLECTIVE_GRACE_SECONDS and rank in self.pods:
                    signals.append(CollectiveErrorReported(rank, self.pods[rank].node, detail))
        node_of_rank = [self.pods[r].node if r in self.pods else None for r in range(self.layout.world_size)]
        return classify(signals, node_of_rank=node_of_rank,
                        hang_timeout_seconds=self.job.spec.recovery.hang_timeout_seconds)

    def _plan(self, view: CatalogView, failures: tuple[Failure, ...], now: float) -> RecoveryPlan:
        world = self.layout.world_size
        self.cool_downs = {n: t for n, t in self.cool_downs.items() if t > now}
        state = JobState(
            layout=self.layout,
            node_of_rank=tuple(self.pods[r].node for r in range(world)),
            cluster=ClusterState(nodes=tuple(self.nodes[n] for n in sorted(self.nodes)),
                                 cool_downs=tuple(sorted(self.cool_downs.items()))),
            # a resumed run's trainers may not have reported yet: the restored L2 step is reached
            step=max(view.progress.step, self.resumed_from or 0), generation=self.generation, restarts=self.restarts,
            holdings=view.holdings, latest_complete_step=view.complete_step,
        )
        plan = plan_recovery(state, failures, self.job.spec, now=now)
        self._event(f"generation {plan.generation}: {plan.action.value} — {plan.reason}")
        return plan

    def _apply(self, plan: RecoveryPlan, view: CatalogView, now: float, noticed: float | None = None) -> None:
        for pod in self.pods.values():  # every termination seen so far is answered by this plan
            for role in ("trainer", "sidecar"):
                if pod.exit_code(role) not in (None, 0):
                    pod.handled.add(role)
        self.cool_downs.update(dict(plan.cool_downs))
        self.generation, self.restarts = plan.generation, plan.restarts
        self._collective_seen.clear()
        self._acted_at = now
        self.snapshot.recoveries.append(RecoveryRecord(
            generation=plan.generation, action=plan.action.value, failures=[f.describe() for f in plan.failures],
            ranks=sorted({r for f in plan.failures for r in f.ranks}), from_step=view.progress.step,
            restore_step=plan.restore_step, tier=plan.farthest_tier, started_at=now,
            failed_at=self._injected_at, noticed_at=noticed, planned_at=time.time()))
        record = self.snapshot.recoveries[-1]
        self._injected_at = None
        if plan.action is RecoveryAction.RESHARD:
            self._reshard(plan)
            record.published_at = record.launched_at = time.time()
            return
        self.catalog.put_plan(plan.generation, plan_document(plan))
        record.published_at = time.time()
        gone = []
        for placement in plan.create_pods:
            old = self.pods.pop(placement.rank, None)
            if old is not None:
                old.stop(grace=0.5, keep_arena=True)  # its arena is dropped once the replacement runs
                gone.append(old)
            if placement.node is None:
                raise RecoveryError(f"no node has room for rank {placement.rank}; run with more --spare-nodes",
                                    job=self.name, rank=placement.rank)
            self._create_pod(placement.rank, placement.node)
        replaced = {p.rank for p in plan.create_pods}
        started = set(replaced)
        for rank in range(self.layout.world_size):
            pod = self.pods[rank]
            if rank not in replaced and pod.exit_code("trainer") not in (None, 0):
                started.add(rank)
                pod.start_trainer(self._spare(pod.node, "trainer"))  # in place: its sidecar kept the L0 copy
        record.launched_at = time.time()
        record.spares = sum(self.pods[r].trainer_from_spare for r in started)
        for old in gone:
            old.drop_arena()
        self._write_pids()

    def _restart_stragglers(self, view: CatalogView) -> None:
        """Kill and restart in place every surviving trainer stuck in the old generation (see
        :data:`STRAGGLER_SECONDS`); the plan stays: it rejoins the plan's generation and restores
        the plan's step like a restarted rank."""
        recs = self.snapshot.recoveries
        if not recs or recs[-1].resumed_at is not None or recs[-1].published_at is None \
                or recs[-1].action == RecoveryAction.RESHARD.value:
            return
        rec = recs[-1]
        if time.time() - rec.published_at < STRAGGLER_SECONDS:
            return
        for rank, pod in self.pods.items():
            report = view.reports.get(rank, {})
            if pod.exit_code("trainer") is not None or (pod.trainer_started_at or 0.0) >= rec.started_at:
                continue  # dead (answered by _failures) or started for this plan
            if int(report.get("generation", -1)) >= rec.generation or \
                    int(report.get("plan_generation", -1)) >= rec.generation:
                continue  # it read the plan (the runtime's "plan" report) or already joined
            pod.kill("trainer")
            pod.start_trainer(self._spare(pod.node, "trainer"))
            rec.stragglers.append(rank)
            self._event(f"rank {rank} was stuck in generation {rec.generation - 1} {STRAGGLER_SECONDS:.1f} s "
                        f"after the plan: restarted in place")
            self._write_pids()

    def _reshard(self, plan: RecoveryPlan) -> None:
        """Stop every rank; start the plan's layout from the latest L2 checkpoint."""
        for pod in self.pods.values():
            pod.stop(grace=0.5)
        self.pods.clear()
        self.layout = plan.layout
        from lifeline.sidecar.catalog import Catalog

        assert self.services is not None
        self.catalog.close()
        self.catalog = Catalog(self.services.redis_url, self.name, self.layout.world_size)
        start = self._resume_plan()
        if start is None:
            raise RecoveryError("resharding needs an L2 checkpoint and the L2 store holds none", job=self.name)
        start = RecoveryPlan(**{**start.__dict__, "generation": plan.generation, "restarts": plan.restarts})
        self.catalog.put_plan(plan.generation, plan_document(start))
        for rank in range(self.layout.world_size):
            self._create_pod(rank, plan.node_of_rank[rank] or f"node-{rank}")
        self.snapshot.layout = self.layout

    def _close_recoveries(self, view: CatalogView) -> None:
        if not self.snapshot.recoveries:
            return
        rec = self.snapshot.recoveries[-1]
        world = self.layout.world_size
        if rec.resumed_at is None and view.generation >= self.generation \
                and view.progress.trained_in(self.generation, world):
            rec.resumed_at = time.time()
            self._event(f"generation {rec.generation} resumed training after {rec.seconds:.2f} s")
        if rec.caught_up_at is None and all(
                int(view.reports.get(r, {}).get("generation", -1)) >= rec.generation
                and view.reports[r].get("event") in ("step", "save", "done")
                and int(view.reports[r].get("step") or 0) > rec.from_step for r in range(world)):
            rec.caught_up_at = time.time()

    # ------------------------------------------------------------------ display
    def _event(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.snapshot.events.append(f"{stamp} {text}")

    def _notify(self) -> None:
        if self.on_update is not None:
            self.on_update(self.snapshot)
