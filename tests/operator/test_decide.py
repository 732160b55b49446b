"""observe.py's pure parsers and decide.py: observations -> failures -> plan -> pod actions.

Pods and nodes are API-shaped dicts as the API server returns them; decisions come from
lifeline.control, so these tests check the wiring (what is a signal, what is answered once,
what is created and deleted), not the recovery ladder itself (tests/control covers it).
"""

from __future__ import annotations

import dataclasses
import json

from lifeline.api.manifests import PodConfig, rank_pod
from lifeline.api.recovery import Holding, RecoveryPlan
from lifeline.api.trainingjob import TrainingJobStatus
from lifeline.catalog import CatalogView, ProgressReport, SidecarRegistration
from lifeline.control import (ClusterState, ContainerTerminated, FailureKind, NodeCondition, NodeState, PodGone,
                              SidecarState)
from lifeline.operator import decide as _decide
from lifeline.operator.observe import (
    Observation,
    node_signals,
    node_states,
    pod_signals,
    pods_by_rank,
    sidecar_states,
)
from lifeline.operator.decide import source_holders
from lifeline.operator.recorded import Recorded


def decide(spec, recorded, obs, status, *, now):
    """The operator's decide with the status as the API server holds it (wire form)."""
    return _decide.decide_from_cluster(spec, recorded, obs, TrainingJobStatus.model_validate(status), now=now)

NOW = 1_800_000_000.0
NODES = ["node-a", "node-b", "node-c"]


def _node(name: str, ready: str = "True", taints=()) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": t, "effect": "NoExecute"} for t in taints]},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def _running_pod(job, rank: int, node: str, generation: int = 0, *, uid: str | None = None,
                 trainer: dict | None = None, restarts: int = 0) -> dict:
    pod = rank_pod(job, rank, generation=generation, config=PodConfig(redis_url="redis://r"))
    pod["metadata"]["uid"] = uid or f"uid-{rank}-{generation}"
    pod["spec"]["nodeName"] = node
    running = {"running": {"startedAt": "2027-01-15T07:00:00Z"}}
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": "trainer", "ready": True, "restartCount": restarts, "state": trainer or running},
            {"name": "sidecar", "ready": True, "restartCount": 0, "state": running},
        ],
    }
    return pod


def _obs(job, pods: dict, *, nodes=None, progress=None, registered=None, generation=0, holdings=frozenset()):
    nodes = nodes or [_node(n) for n in NODES]
    node_of = {r: (p.get("spec") or {}).get("nodeName") or "" for r, p in pods.items()}
    registered = range(4) if registered is None else registered
    return Observation(
        pods=pods,
        nodes={n["metadata"]["name"]: n for n in nodes},
        cluster=ClusterState(nodes=node_states(nodes)),
        catalog=CatalogView(
            generation=generation,
            reports=progress or {},
            registrations={r: SidecarRegistration(r, node_of.get(r, ""), "127.0.0.1", 7070) for r in registered},
            holdings=holdings,
        ),
        at=NOW,
    )


def _progress(event: str, step: int, generation: int = 0, t: float = NOW - 1) -> dict:
    return {r: ProgressReport(event, "j", r, generation, t, step) for r in range(4)}


def _holdings(step: int) -> frozenset:
    """L0 of every rank plus one L1 copy on a rank of another node (nodes a, b, c, a), at ``step``."""
    peer = {0: 1, 1: 2, 2: 3, 3: 1}
    return frozenset({Holding(step, r, "L0", r) for r in range(4)} | {Holding(step, r, "L1", peer[r]) for r in range(4)})


def _placement(ranks=range(4)) -> dict:
    return {r: NODES[r % 3] for r in ranks}


def test_first_reconcile_creates_every_pod(job):
    d = decide(job.spec, Recorded(), _obs(job, {}), {}, now=NOW)
    assert (d.phase, d.generation, d.create, d.delete, d.plan) == ("Pending", 0, (0, 1, 2, 3), (), None)


def test_running_when_every_pod_ready(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("step", 5)), {"phase": "Pending"},
               now=NOW)
    assert (d.phase, d.reason, d.create, d.failures) == ("Running", "AllRanksReady", (), ())


def test_trainer_crash_restarts_in_place_once(job):
    crashed = {"terminated": {"exitCode": 1, "reason": "Error"}}
    pods = {r: _running_pod(job, r, n, trainer=crashed if r == 2 else None) for r, n in _placement().items()}
    obs = _obs(job, pods, progress=_progress("step", 9), holdings=_holdings(8))
    d = decide(job.spec, Recorded(applied=0), obs, {"phase": "Running", "restarts": 0}, now=NOW)
    assert [f.kind for f in d.failures] == [FailureKind.TRAINER_CRASH]
    assert d.plan.action.value == "RestartInPlace" and d.plan.restore_step == 8
    assert (d.phase, d.generation, d.create, d.delete) == ("Recovering", 1, (), ())
    # the same observation after the plan was committed is not a new failure
    rec = Recorded.from_annotations(Recorded().commit_patch(d.plan, d.handled)["metadata"]["annotations"])
    assert rec.generation == 1 and rec.plan == d.plan
    again = decide(job.spec, rec, obs, {"phase": "Recovering", "restarts": 1}, now=NOW + 3)
    assert again.plan is None and again.phase == "Recovering"
    # ...nor once the kubelet restarted it in place (restartCount 1, running)
    pods[2] = _running_pod(job, 2, "node-c", uid="uid-2-0", restarts=1)
    later = decide(job.spec, rec, _obs(job, pods, progress=_progress("step", 9), generation=1),
                   {"phase": "Recovering", "restarts": 1}, now=NOW + 6)
    assert later.plan is None and later.phase == "Recovering"
    # training resumes in generation 1: Running again, recovery closed
    done = decide(job.spec, rec, _obs(job, pods, progress=_progress("step", 10, generation=1), generation=1),
                  {"phase": "Recovering", "restarts": 1}, now=NOW + 9)
    assert (done.phase, done.resumed, done.reason) == ("Running", True, "Recovered")


def test_lost_node_replaces_its_pods_elsewhere(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}  # node-a: ranks 0 and 3
    nodes = [_node("node-a", "Unknown", taints=["node.kubernetes.io/unreachable"]), _node("node-b"), _node("node-c")]
    obs = _obs(job, pods, nodes=nodes, progress=_progress("step", 12), holdings=_holdings(11), registered=[1, 2])
    d = decide(job.spec, Recorded(applied=0), obs, {"phase": "Running", "restarts": 0}, now=NOW)
    assert [(f.kind, f.ranks) for f in d.failures] == [(FailureKind.NODE_LOST, (0, 3))]
    assert d.plan.action.value == "ReplacePods" and d.plan.restore_step == 11
    assert (d.create, d.delete, d.generation) == ((0, 3), (0, 3), 1)
    assert "node-a" in d.avoid_nodes
    # after the commit: the old incarnations (generation 0) are stale -> deleted and recreated, no new failure
    rec = Recorded.from_annotations(Recorded().commit_patch(d.plan, d.handled)["metadata"]["annotations"])
    assert rec.cool_downs["node-a"] == NOW + job.spec.recovery.node_cooldown_seconds
    again = decide(job.spec, rec, obs, {"phase": "Recovering", "restarts": 1}, now=NOW + 1)
    assert (again.plan, again.delete, again.create) == (None, (0, 3), (0, 3))
    # old pods gone, new ones not yet created: created (no PodGone while applying)
    fresh = {r: p for r, p in pods.items() if r not in (0, 3)}
    step = decide(job.spec, rec, _obs(job, fresh, nodes=nodes, progress=_progress("step", 12), generation=1,
                                      registered=[1, 2]), {"phase": "Recovering", "restarts": 1}, now=NOW + 2)
    assert (step.plan, step.create, step.delete) == (None, (0, 3), ())
    assert step.avoid_nodes == {"node-a"}


def test_reshard_keeps_the_pods_of_the_smaller_layout_and_reads_from_memory(job):
    """Healthy nodes with room for 2 pods (capacities from requests): the elastic job drops to one
    replica group. Rank 1's pod stays (its trainer adopts the layout in place) and lost rank 0 is
    recreated. With room for one pod per node, rank 0's new pod needs node-c, so rank 2's pod there
    is evicted at once: its sidecar held the only surviving copy of rank 2's shard at step 11, and
    the reshard reads that shard from L2 at step 10. With a third free node, rank 2's pod serves
    the step from memory until the new generation trains."""
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}  # node-a: ranks 0 and 3
    nodes = [_node("node-a", "Unknown", taints=["node.kubernetes.io/unreachable"]), _node("node-b"), _node("node-c")]
    l2 = Holding.complete(10, 4)
    obs = _obs(job, pods, nodes=nodes, progress=_progress("step", 12), holdings=_holdings(11) | l2,
               registered=[1, 2])
    obs = dataclasses.replace(obs, cluster=ClusterState(nodes=tuple(
        dataclasses.replace(n, capacity=1) for n in obs.cluster.nodes)))
    tight = decide(job.spec, Recorded(applied=0), obs, {"phase": "Running", "restarts": 0}, now=NOW)
    assert tight.plan.action.value == "Reshard" and tight.plan.restore_step == 10
    assert (tight.create, tight.delete) == ((0,), (0, 2, 3)) and 2 not in source_holders(tight.plan)
    roomy = dataclasses.replace(obs, cluster=ClusterState(nodes=(*obs.cluster.nodes, NodeState("node-d", capacity=1))))
    d = decide(job.spec, Recorded(applied=0), roomy, {"phase": "Running", "restarts": 0}, now=NOW)
    assert d.plan.action.value == "Reshard" and d.plan.restore_step == 11  # the latest step in memory
    assert {s.tier for s in d.plan.sources} <= {"L0", "L1"} and 2 in source_holders(d.plan)
    assert d.layout.world_size == 2 and d.layout.data == 1
    assert (d.create, d.delete) == ((0,), (0, 3))
    assert d.plan.node_of_rank == ("node-d", "node-b")
    # after the commit, until the new generation trains: rank 0's old pod is stale, rank 2 serves
    rec = Recorded.from_annotations(Recorded().commit_patch(d.plan, d.handled)["metadata"]["annotations"])
    again = decide(job.spec, rec, obs, {"phase": "Recovering", "restarts": 1}, now=NOW + 1)
    assert (again.plan, again.create, again.delete) == (None, (0,), (0, 3))
    pod = rank_pod(job, 0, generation=1, config=PodConfig(redis_url="redis://r:6379/0"), layout=again.layout)
    env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c["env"]}
    assert json.loads(env["LIFELINE_LAYOUT"])["data"] == 1 and env["LIFELINE_WORLD_SIZE"] == "2"
    # once both ranks trained in generation 1, rank 2's pod goes too
    kept = {0: _running_pod(job, 0, "node-b", generation=1), 1: pods[1], 2: pods[2]}
    trained = {r: ProgressReport("step", "j", r, 1, NOW + 1, 13) for r in range(2)}
    done = decide(job.spec, rec, _obs(job, kept, nodes=nodes, progress=trained, registered=[0, 1, 2], generation=1,
                                      holdings=frozenset(Holding(13, r, "L0", r) for r in range(2))),
                  {"phase": "Recovering", "restarts": 1}, now=NOW + 2)
    assert done.phase == "Running" and done.delete == (2,) and done.create == ()


def test_missing_pod_after_apply_is_pod_lost(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items() if r != 1}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("step", 4), holdings=_holdings(3)),
               {"phase": "Running"}, now=NOW)
    assert [(f.kind, f.ranks) for f in d.failures] == [(FailureKind.POD_LOST, (1,))]
    assert d.plan.action.value == "ReplacePods" and d.create == (1,)


def test_max_restarts_gives_up(job):
    crashed = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    pods = {r: _running_pod(job, r, n, trainer=crashed if r == 0 else None) for r, n in _placement().items()}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("step", 4), holdings=_holdings(3)),
               {"phase": "Running", "restarts": job.spec.recovery.max_restarts}, now=NOW)
    assert (d.phase, d.reason) == ("Failed", "GiveUp") and "maxRestarts" in d.message
    assert d.create == () and d.delete == ()


def test_every_rank_done_is_success(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("done", 60)), {"phase": "Running"},
               now=NOW)
    assert d.phase == "Succeeded" and not d.resumed


def test_finishing_while_recovering_closes_the_recovery(job):
    # a short job can finish between two resync ticks of a recovery: it resumed, so the record closes
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("done", 60)),
               {"phase": "Recovering"}, now=NOW)
    assert (d.phase, d.resumed) == ("Succeeded", True)


def test_hang_detected_after_timeout_only(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    hang = job.spec.recovery.hang_timeout_seconds
    fresh = _obs(job, pods, progress=_progress("step", 7, t=NOW - hang + 5), holdings=_holdings(7))
    assert decide(job.spec, Recorded(applied=0), fresh, {"phase": "Running"}, now=NOW).failures == ()
    stale = _obs(job, pods, progress=_progress("step", 7, t=NOW - hang - 1), holdings=_holdings(7))
    d = decide(job.spec, Recorded(applied=0), stale, {"phase": "Running"}, now=NOW)
    assert [f.kind for f in d.failures] == [FailureKind.HANG]


def test_pod_signal_parsing(job):
    evicted = _running_pod(job, 0, "node-a")
    evicted["status"] = {"phase": "Failed", "reason": "Evicted"}
    restarted = _running_pod(job, 1, "node-b", restarts=2)
    restarted["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 75, "reason": "Error"}}
    pods = pods_by_rank([evicted, restarted], 4)
    sig = pod_signals(pods, 4, missing_is_failure=True, handled={"uid-1-0": {"trainer": 1}})
    assert sig == [PodGone(0, "node-a", "Evicted"), ContainerTerminated(1, "node-b", "trainer", 75, "Error"),
                   PodGone(2, None, "pod missing"), PodGone(3, None, "pod missing")]
    assert pod_signals(pods, 4, missing_is_failure=False, handled={"uid-1-0": {"trainer": 2}}) == [
        PodGone(0, "node-a", "Evicted")]


def test_node_and_heartbeat_signals():
    nodes = [_node("a"), _node("b", "False"), _node("c", taints=["node.kubernetes.io/unreachable"])]
    assert node_signals(nodes, ["a", "b", "c", "gone"]) == [
        NodeCondition("a", True), NodeCondition("b", False), NodeCondition("c", True, unreachable=True),
        NodeCondition("gone", False, unreachable=True)]
    assert [n.ready for n in node_states(nodes)] == [True, False, False]


def test_sidecar_states_are_the_ready_running_sidecars(job):
    pod = _running_pod(job, 0, "node-a")
    started = 1_800_000_000.0 - 3600  # 07:00, the pod's startedAt
    assert sidecar_states({0: pod}) == (SidecarState(0, "node-a", started, None),)
    assert sidecar_states({0: pod}, {(0, "uid-0-0"): started + 5}) == (SidecarState(0, "node-a", started, started + 5),)
    pod["status"]["containerStatuses"][1]["ready"] = False
    assert sidecar_states({0: pod}) == ()


def test_a_silent_sidecar_is_lost_once_its_startup_grace_passed(job):
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    started = 1_800_000_000.0 - 3600
    grace = job.spec.recovery.startup_grace_seconds
    young = _obs(job, pods, progress=_progress("step", 7), holdings=_holdings(7), registered=[0, 1, 3])
    assert decide(job.spec, Recorded(applied=0), young, {"phase": "Running"}, now=started + grace - 1).failures == ()
    d = decide(job.spec, Recorded(applied=0), young, {"phase": "Running"}, now=started + grace + 1)
    assert [(f.kind, f.ranks) for f in d.failures] == [(FailureKind.NODE_LOST, (2,))]  # node-c's only sidecar
    assert "stopped heartbeating" in d.failures[0].detail


def test_the_plan_document_round_trips(job):
    """The plan the operator records in annotations and the catalog is one document: to_json/from_json."""
    crashed = {"terminated": {"exitCode": 1, "reason": "Error"}}
    pods = {r: _running_pod(job, r, n, trainer=crashed if r == 0 else None) for r, n in _placement().items()}
    d = decide(job.spec, Recorded(applied=0), _obs(job, pods, progress=_progress("step", 6), holdings=_holdings(5)),
               {"phase": "Running"}, now=NOW)
    assert RecoveryPlan.from_json(d.plan.to_json()) == d.plan
    assert json.loads(d.plan.to_json())["restoreStep"] == 5 and d.plan.generation == 1


def test_pod_evicted_from_a_lost_node(job):
    """The taint manager marks the lost node's pod for deletion: it is still the node's rank (a
    cool-down for that node), it is force-deleted to free its name, and it raises no second plan."""
    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    evicted = pods.pop(2)  # node-c
    evicted["metadata"]["deletionTimestamp"] = "2027-01-15T07:59:50Z"
    nodes = [_node("node-a"), _node("node-b"), _node("node-c", "Unknown", taints=["node.kubernetes.io/unreachable"])]

    def obs(generation=0):
        o = _obs(job, pods, nodes=nodes, progress=_progress("step", 12, generation), holdings=_holdings(11),
                 generation=generation)
        return Observation(**{**o.__dict__, "terminating": {2: evicted}})

    d = decide(job.spec, Recorded(applied=0), obs(), {"phase": "Running"}, now=NOW)
    assert [(f.kind, f.ranks, f.node) for f in d.failures] == [(FailureKind.NODE_LOST, (2,), "node-c")]
    assert (d.plan.action.value, d.create, d.delete) == ("ReplacePods", (2,), (2,))
    assert "node-c" in d.avoid_nodes
    rec = Recorded.from_annotations(Recorded().commit_patch(d.plan, d.handled)["metadata"]["annotations"])
    again = decide(job.spec, rec, obs(1), {"phase": "Recovering", "restarts": 1}, now=NOW + 2)
    assert (again.plan, again.failures, again.create, again.delete) == (None, (), (2,), (2,))


def test_a_drained_pod_whose_trainer_still_saves_its_step_is_no_failure_until_it_left(job):
    """``kubectl drain`` evicts rank 1's pod (grace 60 s): while its trainer runs within the grace it
    checkpoints its step to L1 (docs/preemption.md), so no plan yet; once the trainer exited, or the
    grace ran out, or the pod is gone, the rank is lost as before."""
    from lifeline.operator.observe import leaving

    pods = {r: _running_pod(job, r, n) for r, n in _placement().items()}
    drained = pods.pop(1)
    drained["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:55Z"  # NOW + 55 s: SIGKILL then

    def obs(pod):
        o = _obs(job, pods, progress=_progress("step", 12), holdings=_holdings(11))
        return Observation(**{**o.__dict__, "terminating": {1: pod} if pod else {}})

    assert leaving({1: drained}, NOW) == {1} and leaving({1: drained}, NOW + 56) == frozenset()
    d = decide(job.spec, Recorded(applied=0), obs(drained), {"phase": "Running"}, now=NOW)
    assert (d.plan, d.failures, d.create, d.delete) == (None, (), (), ())
    exited = json.loads(json.dumps(drained))
    exited["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 143, "reason": "Error"}}
    for later, now in ((exited, NOW + 5), (drained, NOW + 56), (None, NOW + 5)):
        d = decide(job.spec, Recorded(applied=0), obs(later), {"phase": "Running"}, now=now)
        assert d.plan is not None and [f.ranks for f in d.failures] == [(1,)], (later is None, now - NOW)
