"""The engine's hang rule (issue 15, honest accounting): no step progress for ``hangTimeoutSeconds`` is a
HANG; while recovering, trainers the plan restarted that have not reported yet get the startup grace,
and past it a rank that runs and still says nothing is frozen: restarted in its pod while its sidecar
heartbeats and the runner can (``lifeline run``), its pod replaced otherwise (the operator)."""

from __future__ import annotations

from pathlib import Path

import yaml

import dataclasses

from lifeline.api import FailureKind, RecoveryAction, load_trainingjob
from lifeline.catalog import ProgressReport
from lifeline.control import CatalogFacts, ClusterState, NodeState, Observed, Progress, Record, SidecarState, decide

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt-moe.yaml"
T = 1_000_000.0
NODES = ("n0", "n1", "n2", "n3")


def _spec():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["recovery"].update(hangTimeoutSeconds=8, startupGraceSeconds=60)
    return load_trainingjob(body).spec


def _observed(times: dict[int, float], generation: int) -> Observed:
    reports = [ProgressReport("plan" if at >= T else "step", "j", r, generation if at >= T else generation - 1, at, 5)
               for r, at in times.items()]
    return Observed(node_of_rank=NODES, cluster=ClusterState(tuple(NodeState(n, capacity=1) for n in NODES)),
                    sidecars=tuple(SidecarState(r, NODES[r], T - 100, T) for r in range(4)),
                    ready=frozenset(range(4)),
                    catalog=CatalogFacts(generation=generation, progress=Progress.of(reports, generation),
                                         registered={r: NODES[r] for r in range(4)}))


def _hang(decision) -> bool:
    return any(f.kind is FailureKind.HANG for f in decision.failures)


def test_running_job_without_progress_hangs_after_the_timeout_only():
    spec, record = _spec(), Record(phase="Running")
    observed = _observed({r: T - 20 for r in range(4)}, 1)
    assert not _hang(decide(spec, record, observed, now=T - 20 + 7.9))
    d = decide(spec, record, observed, now=T - 20 + 8.1)
    assert _hang(d) and d.plan is not None and d.plan.restart_ranks == (0, 1, 2, 3)


def test_recovering_trainers_still_starting_get_the_startup_grace():
    spec = _spec()
    record = Record(phase="Recovering", generation=1, acted_at=T)
    starting = _observed({0: T + 1, 1: T + 1, 2: T + 1, 3: T - 30}, 1)  # rank 3 restarted, not reported yet
    assert not decide(spec, record, starting, now=T + 30).failures  # past hangTimeoutSeconds, within the grace
    frozen = decide(spec, record, starting, now=T + 61)  # past the grace: rank 3 runs and says nothing
    assert [(f.kind, f.ranks) for f in frozen.failures] == [(FailureKind.POD_LOST, (3,))]
    assert frozen.plan is not None and [p.rank for p in frozen.plan.create_pods] == [3]
    everyone = _observed({r: T + 1 for r in range(4)}, 1)  # every rank spoke since the plan: the timeout holds
    assert not _hang(decide(spec, record, everyone, now=T + 8.9))
    assert _hang(decide(spec, record, everyone, now=T + 9.1))


def test_a_frozen_trainer_whose_sidecar_heartbeats_is_restarted_in_its_pod_where_the_runner_can():
    """Fuzz regression seeds 143203680, 3 and 12: replacing the pod threw away its sidecar's L0 copies
    and the job rolled back to L2 or the initial state although memory held every shard."""
    spec = _spec()
    record = Record(phase="Recovering", generation=1, acted_at=T)
    starting = dataclasses.replace(_observed({0: T + 1, 1: T + 1, 2: T + 1, 3: T - 30}, 1), restarts_trainers=True)
    d = decide(spec, record, starting, now=T + 61)
    assert [(f.kind, f.ranks) for f in d.failures] == [(FailureKind.HANG, (3,))]
    assert "restarted in its pod" in d.failures[0].detail
    assert d.plan is not None and not d.plan.create_pods and d.plan.restart_ranks == (0, 1, 2, 3)
    assert d.plan.action is not RecoveryAction.REPLACE_PODS  # (no holdings here: from the initial state)
    # its sidecar stopped heartbeating too: nothing in that pod holds anything, the pod is replaced
    facts = dataclasses.replace(starting.catalog, registered={r: NODES[r] for r in range(3)})
    gone = decide(spec, record, dataclasses.replace(starting, catalog=facts), now=T + 61)
    assert FailureKind.HANG not in {f.kind for f in gone.failures}


def test_silent_since_names_ranks_without_a_report_since():
    p = Progress.of([ProgressReport("step", "j", 0, 0, T, 3), ProgressReport("step", "j", 2, 0, T - 5, 3)], 0)
    assert p.silent_since(T - 1, 4) == frozenset({1, 2, 3})
    assert p.silent_since(T - 10, 4) == frozenset({1, 3})


def test_a_failure_while_no_sidecar_is_registered_waits_for_them_to_register_again():
    """Redis came back empty (no registration, no holding) while sidecars run: a trainer crash seen
    then is not planned on the empty catalog (it would start over) until the sidecars registered
    again, or until the start-up grace since one was last seen registered ran out."""
    from dataclasses import replace

    from lifeline.control import ContainerTerminated

    spec, record = _spec(), Record(phase="Running")
    crash = ContainerTerminated(1, NODES[1], "trainer", 137, "Killed")
    ok = replace(_observed({r: T - 1 for r in range(4)}, 0), signals=(crash,))
    emptied = replace(ok, catalog=replace(ok.catalog, registered={}))
    waiting = decide(spec, record, emptied, now=T + 5)
    assert waiting.plan is None and waiting.settling and waiting.reason == "CatalogRebuilding"
    assert [(f.kind, f.ranks) for f in waiting.failures] == [(FailureKind.TRAINER_CRASH, (1,))]
    assert decide(spec, record, emptied, now=T + 61).plan is not None, "bounded by the start-up grace"
    assert decide(spec, record, ok, now=T + 5).plan is not None, "registered again: planned"
