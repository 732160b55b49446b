"""Classify raw failure signals into :class:`Failure` values (pure; no I/O).

The operator observes pods, nodes and the Redis catalog and turns what it sees into the
signal dataclasses below (DESIGN.md "Failures": container or pod terminated; node Ready not
True, or the unreachable taint; sidecar heartbeat expired; no step progress within the hang
timeout; a collective error inside a trainer). :func:`classify` maps them to failures,
keeps one failure per rank (the most severe), folds the failures of ranks on a lost node into
that node's ``NODE_LOST`` (a node whose every sidecar stopped heartbeating counts as lost: its
kubelet may not have been noticed yet, which takes the node-monitor grace period), and drops collective errors that are only the echo of another
rank's failure (every peer of a crashed rank sees its collectives fail).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lifeline.api.recovery import Failure, FailureKind

__all__ = [
    "EXIT_COLLECTIVE_ERROR",
    "FailureKind",
    "Failure",
    "ContainerTerminated",
    "PodGone",
    "NodeCondition",
    "HeartbeatExpired",
    "StepStalled",
    "CollectiveErrorReported",
    "TrainerSilent",
    "Signal",
    "classify",
]

#: Exit code a trainer uses when a collective failed because a peer went away while the
#: trainer itself is healthy (EX_TEMPFAIL from sysexits.h: "try again").
EXIT_COLLECTIVE_ERROR = 75


_SEVERITY = {kind: i for i, kind in enumerate(FailureKind)}


@dataclass(frozen=True)
class ContainerTerminated:
    """A container of a rank's pod terminated (``containerStatuses[].state.terminated``)."""

    rank: int
    node: str | None
    container: str  # "trainer" or "sidecar"
    exit_code: int
    reason: str = ""  # e.g. "Error", "OOMKilled"


@dataclass(frozen=True)
class PodGone:
    """A rank's pod was deleted, evicted or reached phase Failed."""

    rank: int
    node: str | None
    reason: str = ""


@dataclass(frozen=True)
class NodeCondition:
    """A node's health: its Ready condition (``None`` for Unknown) and the unreachable taint."""

    node: str
    ready: bool | None
    unreachable: bool = False


@dataclass(frozen=True)
class HeartbeatExpired:
    """A rank's sidecar heartbeat key expired in the catalog (age in seconds since the last beat)."""

    rank: int
    node: str | None
    age_seconds: float


@dataclass(frozen=True)
class StepStalled:
    """The job's step has not advanced for ``seconds`` (since it reached ``step``)."""

    step: int
    seconds: float


@dataclass(frozen=True)
class CollectiveErrorReported:
    """A trainer reported a failed collective (e.g. gloo connection reset) through the catalog."""

    rank: int
    node: str | None
    detail: str = ""


@dataclass(frozen=True)
class TrainerSilent:
    """A rank whose trainer runs (its pod is Ready) went silent during the current recovery for
    ``seconds``: no report and no recovery beat for ``hangTimeoutSeconds`` while another rank beats,
    or nothing at all since the plan restarted it, past the start-up grace. Frozen (SIGSTOP, a dead
    device), it reads no plan and blocks its peers' rendezvous. ``in_place``: its sidecar still heartbeats and the runner can
    restart the trainer in its pod (``lifeline run`` kills the process), so the sidecar's L0 copies
    stay: a ``HANG`` of that rank; otherwise (Kubernetes: nothing but replacing the pod frees it) a
    ``POD_LOST``."""

    rank: int
    node: str | None
    seconds: float
    in_place: bool = False


Signal = (ContainerTerminated | PodGone | NodeCondition | HeartbeatExpired | StepStalled | CollectiveErrorReported
          | TrainerSilent)


def classify(
    signals: Iterable[Signal],
    *,
    node_of_rank: Sequence[str | None],
    hang_timeout_seconds: float,
) -> tuple[Failure, ...]:
    """Turn raw signals into failures, most severe first, then by rank.

    Args:
        signals: what the operator observed this round.
        node_of_rank: node of each rank (index = global rank); length = world size.
        hang_timeout_seconds: ``spec.recovery.hangTimeoutSeconds``.

    Returns:
        Failures, one per rank at most (``NODE_LOST`` and ``HANG`` cover several ranks). A
        trainer that exited 0, a Ready node, a lost node hosting none of the job's ranks and a
        signal about a rank outside the world size (a pod left over from a larger generation,
        being deleted) are not failures. ``COLLECTIVE_ERROR`` is kept
        only when nothing else failed (otherwise it is the echo of that failure).
    """
    world = len(node_of_rank)
    per_rank: dict[int, Failure] = {}
    lost_nodes: dict[str, str] = {}
    silent: dict[str, set[int]] = {}
    hang: Failure | None = None

    def keep(failure: Failure) -> None:
        for rank in failure.ranks:
            old = per_rank.get(rank)
            if old is None or _SEVERITY[failure.kind] < _SEVERITY[old.kind]:
                per_rank[rank] = failure

    for sig in signals:
        if isinstance(sig, (ContainerTerminated, PodGone, HeartbeatExpired, CollectiveErrorReported, TrainerSilent)):
            if not 0 <= sig.rank < world:
                continue
        if isinstance(sig, NodeCondition):
            if sig.ready is not True or sig.unreachable:
                state = "unreachable" if sig.unreachable else f"Ready={'Unknown' if sig.ready is None else 'False'}"
                lost_nodes[sig.node] = state
        elif isinstance(sig, ContainerTerminated):
            if sig.container == "sidecar":
                keep(Failure(FailureKind.SIDECAR_LOST, (sig.rank,), sig.node,
                             f"sidecar exited {sig.exit_code}" + (f" ({sig.reason})" if sig.reason else "")))
            elif sig.exit_code == EXIT_COLLECTIVE_ERROR:
                keep(Failure(FailureKind.COLLECTIVE_ERROR, (sig.rank,), sig.node, f"exit {sig.exit_code}"))
            elif sig.exit_code != 0:
                keep(Failure(FailureKind.TRAINER_CRASH, (sig.rank,), sig.node,
                             f"exit {sig.exit_code}" + (f" ({sig.reason})" if sig.reason else "")))
        elif isinstance(sig, PodGone):
            keep(Failure(FailureKind.POD_LOST, (sig.rank,), sig.node, sig.reason))
        elif isinstance(sig, TrainerSilent) and sig.in_place:
            keep(Failure(FailureKind.HANG, (sig.rank,), sig.node, f"trainer silent {sig.seconds:.0f}s during the "
                         "recovery while its sidecar heartbeats: restarted in its pod"))
        elif isinstance(sig, TrainerSilent):
            keep(Failure(FailureKind.POD_LOST, (sig.rank,), sig.node,
                         f"trainer silent {sig.seconds:.0f}s during the recovery: its pod is replaced"))
        elif isinstance(sig, HeartbeatExpired):
            keep(Failure(FailureKind.SIDECAR_LOST, (sig.rank,), sig.node,
                         f"heartbeat expired {sig.age_seconds:.1f}s ago"))
            if sig.node is not None:
                silent.setdefault(sig.node, set()).add(sig.rank)
        elif isinstance(sig, StepStalled):
            if sig.seconds >= hang_timeout_seconds:
                hang = Failure(FailureKind.HANG, tuple(range(world)), None,
                               f"no progress past step {sig.step} for {sig.seconds:.0f}s "
                               f"(hangTimeoutSeconds {hang_timeout_seconds:g})")
        elif isinstance(sig, CollectiveErrorReported):
            keep(Failure(FailureKind.COLLECTIVE_ERROR, (sig.rank,), sig.node, sig.detail))
        else:  # pragma: no cover - the Signal union is closed
            raise TypeError(f"not a failure signal: {sig!r}")

    for node, ranks in silent.items():  # a node none of whose sidecars beats is lost (its kubelet may still
        if node not in lost_nodes and ranks >= {r for r in range(world) if node_of_rank[r] == node}:  # look Ready)
            lost_nodes[node] = "every sidecar on it stopped heartbeating"
    out: list[Failure] = []
    for node in sorted(lost_nodes):
        ranks = tuple(r for r in range(world) if node_of_rank[r] == node)
        if not ranks:
            continue
        out.append(Failure(FailureKind.NODE_LOST, ranks, node, lost_nodes[node]))
        for rank in ranks:
            per_rank.pop(rank, None)
    distinct = {f for f in per_rank.values()}
    primary = [f for f in distinct if f.kind is not FailureKind.COLLECTIVE_ERROR]
    if out or primary or hang is not None:
        distinct = set(primary)
    if hang is not None and not out and not primary:
        out.append(hang)
    out.extend(sorted(distinct, key=lambda f: (_SEVERITY[f.kind], f.ranks)))
    return tuple(out)
