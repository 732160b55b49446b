"""Applying a recovery plan to ``lifeline run``'s local fleet (mixed into
:class:`~lifeline.launch.supervisor.Supervisor`): publish it in the catalog, replace lost pods, restart
dead trainers in place, change the layout, and restart survivors stuck in the old generation."""

from __future__ import annotations

import time
from typing import Any

from lifeline.api import FailureKind, RecoveryAction, RecoveryPlan
from lifeline.catalog import CatalogView
from lifeline.control import Record
from lifeline.errors import CatalogError, RecoveryError
from lifeline.launch._records import RecoveryRecord, stuck_ranks

__all__ = ["STUCK_SECONDS"]

STUCK_SECONDS = 1.5
"""A surviving trainer that has not read the plan this long after it was published (its latest
report is neither the runtime's ``plan`` report of this generation nor of a newer generation) is
stuck — in a collective of the old group, or frozen: gloo cannot abort it, and a peer that left may
not wake it. It is killed and restarted in place — in its node's spare — within the same plan
(TorchFT kills a process group it cannot abort too)."""


class _Applying:
    """The plan-applying half of the supervisor (it provides the attributes named below)."""

    catalog: Any
    pods: dict[int, Any]
    record: Record
    snapshot: Any
    layout: Any
    job: Any
    name: str
    retiring: Any
    _spare_held: bool
    _injected_at: float | None
    _fault_estimate: float | None

    def _spared(self, plan: RecoveryPlan) -> bool:
        """Spare the step of a plan that reads sidecar memory (a grow, which the trainers read while
        saving on, or a recovery: a save sealed after the plan's catalog view may evict the copy it
        names, :attr:`~lifeline.api.recovery.RecoveryPlan.reads_memory`); ``False`` when a copy it names
        was evicted meanwhile (the next round plans again). The spare lapses once training resumed."""
        assert self.catalog is not None
        if not plan.reads_memory:
            return True
        try:
            if self.catalog.spare(plan, ttl_seconds=self.job.spec.recovery.startup_grace_seconds):
                self._spare_held = True
                return True
        except CatalogError as err:  # Redis away: not this round (a plan is made only from a catalog read)
            self._event(f"cannot spare step {plan.restore_step} for the plan ({err}): planning again")
            return False
        self._event(f"step {plan.restore_step} left sidecar memory before the plan was published: planning again")
        return False

    def _release_spare(self) -> None:
        """Drop the plan's spare once training resumed (best effort: it lapses by its TTL anyway)."""
        if not self._spare_held or self.record.phase != "Running":
            return
        assert self.catalog is not None
        try:
            self.catalog.unspare()
            self._spare_held = False
        except CatalogError:
            pass  # Redis restarting: again next round

    def _apply(self, plan: RecoveryPlan, view: CatalogView, now: float, noticed: float | None) -> None:
        assert self.catalog is not None
        self._event(f"generation {plan.generation}: {plan.action.value} — {plan.reason}")
        for pod in self.pods.values():  # every termination seen so far is answered by this plan
            for role in ("trainer", "sidecar"):
                if pod.exit_code(role) not in (None, 0):
                    pod.handled.add(role)
        cool = {n: t for n, t in self.record.cool_downs.items() if t > now} | dict(plan.cool_downs)
        self.record = Record(phase="Recovering", reason=plan.action.value, message=plan.reason,
                             generation=plan.generation, restarts=plan.restarts, plan=plan, cool_downs=cool,
                             acted_at=now, resumed_from=self.record.resumed_from,
                             state_step=self.record.state_step)
        self.snapshot.phase = "Recovering"
        self.snapshot.recoveries.append(RecoveryRecord(
            generation=plan.generation, action=plan.action.value, failures=[f.describe() for f in plan.failures],
            ranks=list(plan.failed_ranks), from_step=self.snapshot.step, restore_step=plan.restore_step,
            tier=plan.farthest_tier, started_at=now, failed_at=self._injected_at or self._fault_estimate,
            fault="injected" if self._injected_at is not None else "last_step", noticed_at=noticed,
            planned_at=time.time(),
            layout=plan.layout.to_wire() if plan.action is RecoveryAction.RESHARD else None))
        record = self.snapshot.recoveries[-1]
        self._injected_at = self._fault_estimate = None
        if plan.action is RecoveryAction.RESHARD:
            self._relayout(plan)
        forgotten = self.catalog.put_plan(plan)
        record.published_at = time.time()
        if forgotten:
            self._event(f"forgot {forgotten} memory copies that died with ranks {list(plan.memory_lost_ranks)}")
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
        if any(f.kind is FailureKind.HANG for f in plan.failures):  # a hung trainer reads no plan: restart
            for rank in plan.restart_ranks:                          # every one the plan names, now
                pod = self.pods.get(rank)
                if pod is not None and pod.exit_code("trainer") is None:
                    pod.kill("trainer")
        replaced = {p.rank for p in plan.create_pods}
        started = set(replaced)
        for rank in range(self.layout.world_size):
            pod = self.pods[rank]
            # in place (its sidecar kept the L0 copy); a trainer that already finished (exit 0, the failure
            # came at the end) restarts too: the new generation needs every rank, and it is done at once
            if rank not in replaced and pod.exit_code("trainer") is not None:
                started.add(rank)
                self._restart_trainer(pod)
        record.launched_at = time.time()
        record.spares = sum(self.pods[r].trainer_from_spare for r in started)
        for old in gone:
            old.drop_arena()
        self._write_pids()

    def _restart_stuck(self, view: CatalogView) -> None:
        """Kill and restart in place every surviving trainer stuck in the old generation (see
        :data:`STUCK_SECONDS`); the plan stays: it rejoins the plan's generation and restores
        the plan's step like a restarted rank. Under ``LocalizedReplay`` the ranks that keep their state
        are never restarted (their state is what the replay catches up to); gloo's collective timeout
        frees them at the latest."""
        recs = self.snapshot.recoveries
        if not recs or recs[-1].resumed_at is not None or recs[-1].published_at is None:
            return
        rec = recs[-1]
        if time.time() - rec.published_at < STUCK_SECONDS:
            return
        plan = self.record.plan
        keep = set(range(len(self.pods))) - set(plan.restore_ranks) \
            if plan is not None and plan.action is RecoveryAction.LOCALIZED_REPLAY else set()
        for rank in stuck_ranks(rec, self.pods, view.reports):
            if rank in keep:  # its in-memory state is what the replay catches up to: wait for it
                continue
            pod = self.pods[rank]
            pod.kill("trainer")
            self._restart_trainer(pod)
            rec.stuck.append(rank)
            self._event(f"rank {rank} was stuck in generation {rec.generation - 1} {STUCK_SECONDS:.1f} s "
                        f"after the plan: restarted in place")
            self._write_pids()

    def _relayout(self, plan: RecoveryPlan) -> None:
        """Before publishing a ``Reshard`` plan: the new layout, and the dropped pods out of the fleet
        (kept while their sidecars serve the restore step); the kept pods adopt the layout in place."""
        assert self.catalog is not None
        self.layout = plan.layout
        self.catalog.world_size = plan.layout.world_size
        self.snapshot.layout = self.layout
        kept = self.retiring.take(plan, self.pods)
        if kept:
            self._event(f"ranks {kept} leave the layout once the new generation trains (their sidecars serve it)")
