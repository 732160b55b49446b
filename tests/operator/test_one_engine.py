"""One decision engine: the same sequence of events, seen by the operator (pods, nodes, the catalog
as the API server and Redis show them) and by ``lifeline run`` (processes, local nodes, the same
catalog), gives the same plans, round after round.

Each runner's own gathering is the code under test (``lifeline.operator.decide.decide_from_cluster`` from pod
dicts; ``lifeline.launch._observe.observed_of`` from process states, then
``lifeline.control.decide`` as the supervisor calls it). The launcher's pods are a unit-test double
of :class:`lifeline.launch._pods.Pod` (real processes are exercised by tests/launch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lifeline.api.manifests import PodConfig, rank_pod
from lifeline.api.recovery import Holding, RecoveryPlan
from lifeline.api.trainingjob import RecoveryAction, TrainingJobStatus
from lifeline.catalog import CatalogView, LogCoverage, ProgressReport, SidecarRegistration
from lifeline.control import SETTLE_SECONDS, ClusterState, NodeState, Record, Settle
from lifeline.control import decide as engine_decide
from lifeline.launch._observe import observed_of
from lifeline.operator import decide as operator
from lifeline.operator.observe import Observation, node_states
from lifeline.operator.recorded import Recorded

T0 = 1_800_000_000.0
STARTED = "2027-01-15T07:00:00Z"  # every container's start: an hour before T0
STARTED_AT = T0 - 3600
NODES = [f"node-{i}" for i in range(6)]  # one per rank plus two free ones, one pod of the job each


@dataclass
class World:
    """The events so far, in neutral terms both runners' views are rendered from."""

    generation: int = 0
    step: int = 9
    holdings_step: int = 8
    trainer_exit: dict[int, int] = field(default_factory=dict)  # rank -> exit code (not yet answered)
    lost_nodes: set[str] = field(default_factory=set)
    silent: set[int] = field(default_factory=set)  # ranks whose sidecar stopped registering
    collective: dict[int, float] = field(default_factory=dict)  # rank -> when it reported a failure
    node_of: dict[int, str] = field(default_factory=lambda: {r: f"node-{r}" for r in range(4)})
    restarted: set[int] = field(default_factory=set)  # trainers restarted in place since the last plan
    logs: tuple = ()  # upstream-log coverage (LogCoverage) of the ranks that log

    def view(self) -> CatalogView:
        reports = {}
        for r in range(4):
            if r in self.collective:
                reports[r] = ProgressReport("failure", "j", r, self.generation, self.collective[r], self.step,
                                            {"error": "RuntimeError: gloo connection reset"})
            else:
                reports[r] = ProgressReport("step", "j", r, self.generation, T0 - 0.5, self.step)
        peer = {r: (r + 1) % 4 for r in range(4)}
        holdings = {Holding(self.holdings_step, r, "L0", r) for r in range(4)}
        holdings |= {Holding(self.holdings_step, r, "L1", peer[r]) for r in range(4)}
        regs = {r: SidecarRegistration(r, n, f"127.0.0.{r + 2}", 7070) for r, n in self.node_of.items()
                if r not in self.silent and n not in self.lost_nodes}
        return CatalogView(generation=self.generation, reports=reports, registrations=regs,
                           holdings=frozenset(holdings), log_coverage=self.logs)


# --- the operator's view ---------------------------------------------------------------------
def _pod(job, world: World, rank: int) -> dict:
    pod = rank_pod(job, rank, generation=world.generation, config=PodConfig(redis_url="redis://r"))
    pod["metadata"]["uid"] = f"uid-{rank}-{world.node_of[rank]}"
    pod["spec"]["nodeName"] = world.node_of[rank]
    running = {"running": {"startedAt": STARTED}}
    code = world.trainer_exit.get(rank)
    trainer = {"terminated": {"exitCode": code, "reason": "Error"}} if code is not None else running
    restarts = 1 if rank in world.restarted else 0
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [
        {"name": "trainer", "ready": code is None, "restartCount": restarts, "state": trainer},
        {"name": "sidecar", "ready": True, "restartCount": 0, "state": running}]}
    return pod


def _operator_round(job, world: World, recorded: Recorded, status: dict, now: float,
                    last_seen: dict) -> operator.Reconcile:
    nodes = [{"metadata": {"name": n}, "spec": {},
              "status": {"conditions": [{"type": "Ready", "status": "False" if n in world.lost_nodes else "True"}]}}
             for n in NODES]
    cluster = ClusterState(nodes=tuple(dataclasses.replace(n, capacity=1) for n in node_states(nodes)))
    obs = Observation(pods={r: _pod(job, world, r) for r in range(4)}, nodes={n["metadata"]["name"]: n for n in nodes},
                      cluster=cluster, catalog=world.view(), at=now)
    return operator.decide_from_cluster(job.spec, recorded, obs, TrainingJobStatus.model_validate(status), now=now,
                           last_seen=last_seen)


# --- lifeline run's view -----------------------------------------------------------------------
@dataclass
class FakePod:
    """The attributes of :class:`lifeline.launch._pods.Pod` that ``observed_of`` reads."""

    node: str
    codes: dict[str, int] = field(default_factory=dict)
    handled: set[str] = field(default_factory=set)
    sidecar_started_at: float | None = STARTED_AT
    registered_at: float | None = None
    trainer_started_at: float | None = STARTED_AT

    def exit_code(self, role: str) -> int | None:
        return self.codes.get(role)


def _launcher_round(job, world: World, pods: dict[int, FakePod], record: Record, now: float):
    nodes = {n: NodeState(n, ready=n not in world.lost_nodes, capacity=1) for n in NODES}
    for r, pod in pods.items():
        code = world.trainer_exit.get(r)
        if code is not None:
            pod.codes["trainer"] = code
        if pod.node in world.lost_nodes:  # the node took both processes with it
            pod.codes.update(trainer=137 - 256, sidecar=137 - 256)
    observed = observed_of(pods, nodes, world.view(), 4)
    # the supervisor settles first; its rounds reach the same observation SETTLE_SECONDS later
    return engine_decide(job.spec, record, observed, now=now, settle=Settle(now - SETTLE_SECONDS, quiet=False))


def _same(a: RecoveryPlan | None, b: RecoveryPlan | None) -> None:
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert a == b, f"\noperator: {a}\nlauncher: {b}"


def test_operator_and_lifeline_run_make_the_same_plans(job):
    world = World()
    recorded, status = Recorded(applied=0), {"phase": "Running", "restarts": 0}
    record = Record(phase="Running")
    pods = {r: FakePod(f"node-{r}", registered_at=T0 - 0.5) for r in range(4)}
    last_seen = {(r, f"uid-{r}-node-{r}"): T0 - 0.5 for r in range(4)}
    plans = []

    def round_(now: float):
        nonlocal recorded, status, record
        op = _operator_round(job, world, recorded, status, now, last_seen)
        ln = _launcher_round(job, world, pods, record, now)
        assert (op.phase, [(f.kind, f.ranks, f.node) for f in op.failures]) == \
            (ln.phase, [(f.kind, f.ranks, f.node) for f in ln.failures])
        _same(op.plan, ln.plan)
        if op.plan is not None:  # both runners record and apply the plan
            plans.append(op.plan)
            recorded = Recorded.from_annotations(recorded.commit_patch(op.plan, op.handled)["metadata"]["annotations"])
            recorded = dataclasses.replace(recorded, applied=op.plan.generation)
            status = {"phase": "Running", "restarts": op.plan.restarts}  # training resumed in between
            record = Record(phase="Running", generation=op.plan.generation, restarts=op.plan.restarts,
                            plan=op.plan, cool_downs=dict(op.plan.cool_downs), acted_at=now)
            for r, pod in pods.items():
                pod.handled |= {role for role, code in pod.codes.items() if code}
            world.generation = op.plan.generation
        return op

    # 1. healthy: nothing to do
    assert round_(T0).plan is None
    # 2. rank 2's trainer crashes: restart it in place from sidecar memory (L0)
    world.trainer_exit[2] = 1
    assert round_(T0 + 1).plan.action is RecoveryAction.RESTART_IN_PLACE
    world.trainer_exit.clear()
    world.restarted.add(2)
    pods[2].codes.clear()
    pods[2].handled.clear()
    # 3. node-1 is lost (its kubelet reports Ready=False; locally both processes die with it):
    #    rank 1 moves to a free node and restores from a peer's copy (L1)
    world.step, world.holdings_step = 11, 10
    world.lost_nodes.add("node-1")
    op = round_(T0 + 10)
    assert op.plan.action is RecoveryAction.REPLACE_PODS and op.plan.restore_step == 10
    assert [(p.rank, p.node) for p in op.plan.create_pods] == [(1, "node-4")]
    world.node_of[1] = "node-4"
    pods[1] = FakePod("node-4", sidecar_started_at=T0 + 11, registered_at=T0 + 12)
    last_seen[(1, "uid-1-node-4")] = T0 + 12
    # 4. a collective error reported alone waits out collectiveGraceSeconds (its cause may still show) ...
    world.collective[0] = T0 + 20
    grace = job.spec.recovery.collective_grace_seconds
    assert round_(T0 + 20 + grace / 2).plan is None
    # ... and is then answered: rank 0 restarts in place
    op = round_(T0 + 20 + grace + 0.1)
    assert op.plan.action is RecoveryAction.RESTART_IN_PLACE and op.plan.restart_ranks == (0,)
    world.collective.clear()
    # 5. rank 3's sidecar stops heartbeating while its processes still look alive: its node is lost
    world.silent.add(3)
    op = round_(T0 + 40)
    assert [(f.kind.value, f.ranks) for f in op.failures] == [("NODE_LOST", (3,))]
    assert op.plan.action is RecoveryAction.REPLACE_PODS
    assert [p.generation for p in plans] == [1, 2, 3, 4]


def test_both_runners_choose_a_localized_replay_when_the_catalog_shows_log_coverage(job):
    """With ``recovery.localizedReplay`` and the neighbours' logs covering the gap, a trainer crash
    in one stage restores that stage alone, in both runners; without coverage both restart everyone."""
    spec = job.spec.model_copy(update={"recovery": job.spec.recovery.model_copy(update={"localized_replay": True})})
    job = job.model_copy(update={"spec": spec})
    assert job.spec.layout.pipeline == 2 and job.spec.layout.data == 2  # ranks 0, 1: stage 0; 2, 3: stage 1
    for logs, action, ranks in (((), RecoveryAction.RESTART_IN_PLACE, (0, 1, 2, 3)),
                                (tuple(LogCoverage(r, 5, 9) for r in (0, 1)), RecoveryAction.LOCALIZED_REPLAY, (2, 3))):
        world = World(logs=logs)
        world.trainer_exit[2] = 1
        pods = {r: FakePod(f"node-{r}", registered_at=T0 - 0.5) for r in range(4)}
        last_seen = {(r, f"uid-{r}-node-{r}"): T0 - 0.5 for r in range(4)}
        op = _operator_round(job, world, Recorded(applied=0), {"phase": "Running", "restarts": 0}, T0 + 1, last_seen)
        ln = _launcher_round(job, world, pods, Record(phase="Running"), T0 + 1)
        _same(op.plan, ln.plan)
        assert op.plan.action is action and op.plan.restore_ranks == ranks
        assert op.plan.restart_ranks == (2,) and op.plan.restore_step == world.holdings_step
        if action is RecoveryAction.LOCALIZED_REPLAY:
            assert op.plan.replay_to_step == world.step
