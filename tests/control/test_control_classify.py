"""classify(): failure signals to failures."""

from __future__ import annotations

from lifeline.control import (
    EXIT_COLLECTIVE_ERROR,
    CollectiveErrorReported,
    ContainerTerminated,
    Failure,
    FailureKind,
    HeartbeatExpired,
    NodeCondition,
    PodGone,
    StepStalled,
    classify,
)

NODES = ("n0", "n0", "n1", "n1")  # rank -> node


def _classify(*signals):
    return classify(signals, node_of_rank=NODES, hang_timeout_seconds=300)


def test_trainer_exit_codes():
    assert _classify(ContainerTerminated(2, "n1", "trainer", 0, "Completed")) == ()
    assert _classify(ContainerTerminated(2, "n1", "trainer", 137, "OOMKilled")) == (
        Failure(FailureKind.TRAINER_CRASH, (2,), "n1", "exit 137 (OOMKilled)"),
    )
    assert _classify(ContainerTerminated(1, "n0", "trainer", EXIT_COLLECTIVE_ERROR)) == (
        Failure(FailureKind.COLLECTIVE_ERROR, (1,), "n0", f"exit {EXIT_COLLECTIVE_ERROR}"),
    )


def test_sidecar_and_pod_losses_lose_memory():
    (sidecar,) = _classify(ContainerTerminated(3, "n1", "sidecar", 1, "Error"))
    assert sidecar.kind is FailureKind.SIDECAR_LOST and sidecar.kind.loses_memory
    (beat,) = _classify(HeartbeatExpired(0, "n0", 12.5))
    assert beat == Failure(FailureKind.SIDECAR_LOST, (0,), "n0", "heartbeat expired 12.5s ago")
    (pod,) = _classify(PodGone(1, "n0", "Evicted"))
    assert pod == Failure(FailureKind.POD_LOST, (1,), "n0", "Evicted") and pod.kind.loses_memory
    assert not FailureKind.TRAINER_CRASH.loses_memory


def test_node_lost_covers_its_ranks_and_absorbs_their_failures():
    failures = _classify(
        NodeCondition("n0", ready=True),
        NodeCondition("n1", ready=None),
        ContainerTerminated(2, "n1", "trainer", 1),
        HeartbeatExpired(3, "n1", 30.0),
    )
    assert failures == (Failure(FailureKind.NODE_LOST, (2, 3), "n1", "Ready=Unknown"),)
    (tainted,) = _classify(NodeCondition("n0", ready=True, unreachable=True))
    assert (tainted.kind, tainted.ranks, tainted.detail) == (FailureKind.NODE_LOST, (0, 1), "unreachable")


def test_signals_outside_the_job_are_not_failures():
    assert _classify(NodeCondition("spare", ready=False)) == ()  # a lost node hosting no rank of this job
    assert _classify(ContainerTerminated(7, "n1", "trainer", 1), PodGone(4, "n0")) == ()  # stale pods


def test_most_severe_failure_per_rank_wins():
    failures = _classify(ContainerTerminated(2, "n1", "trainer", 1), ContainerTerminated(2, "n1", "sidecar", 1))
    assert [f.kind for f in failures] == [FailureKind.SIDECAR_LOST]


def test_collective_errors_echoing_a_crash_are_dropped():
    crash = ContainerTerminated(3, "n1", "trainer", 1)
    echoes = [CollectiveErrorReported(r, NODES[r], "gloo: connection reset") for r in (0, 1, 2)]
    assert [f.kind for f in _classify(crash, *echoes)] == [FailureKind.TRAINER_CRASH]
    alone = _classify(*echoes)
    assert [(f.kind, f.ranks) for f in alone] == [(FailureKind.COLLECTIVE_ERROR, (r,)) for r in (0, 1, 2)]


def test_hang_only_past_the_timeout_and_covers_every_rank():
    assert _classify(StepStalled(step=40, seconds=299)) == ()
    (hang,) = _classify(StepStalled(step=40, seconds=301))
    assert hang.kind is FailureKind.HANG and hang.ranks == (0, 1, 2, 3)
    assert "step 40" in hang.detail
    assert [f.kind for f in _classify(StepStalled(40, 301), ContainerTerminated(0, "n0", "trainer", 1))] == [
        FailureKind.TRAINER_CRASH
    ]


def test_order_is_by_severity_then_rank():
    failures = _classify(
        ContainerTerminated(3, "n1", "trainer", 1),
        PodGone(0, "n0"),
        ContainerTerminated(2, "n1", "trainer", 2),
    )
    assert [(f.kind, f.ranks) for f in failures] == [
        (FailureKind.POD_LOST, (0,)),
        (FailureKind.TRAINER_CRASH, (2,)),
        (FailureKind.TRAINER_CRASH, (3,)),
    ]
    assert failures[1].describe() == "TRAINER_CRASH ranks [2] on n1: exit 2"
