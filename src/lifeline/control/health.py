"""Which nodes fail the health check before a job uses them (docs/health.md); pure.

Each node reports a :class:`NodeCheck`: the digest and best time of a fixed fp32 matmul chain
(``lifeline.runtime.health``), and the all-reduce bandwidth of each pair of neighbouring nodes it
belonged to (pairs ``(i, i+1 mod n)`` in the nodes' order). :func:`judge` fails a node whose result
differs from the majority's (a wrong answer: a flaky device), whose time exceeds ``threshold`` × the
median, or whose best pair falls below the median node's best pair ÷ ``threshold`` (a slow node is
in two slow pairs, each of its neighbours in one slow and one fast pair: DLRover's network check,
which pairs nodes to find the one in every slow pair). A node whose
check did not finish fails too.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["NodeCheck", "Baseline", "pairs", "judge", "baseline", "judge_against"]


@dataclass(frozen=True)
class NodeCheck:
    """One node's health-check report.

    Attributes:
        digest: hex digest of the matmul chain's result (equal on every healthy node).
        compute_seconds: best wall time of the chain, seconds.
        pair_bandwidth: ``{partner node: bytes per second}`` of the all-reduces it ran with each partner.
        error: why the check did not finish (``None``: it did).
    """

    digest: str = ""
    compute_seconds: float = 0.0
    pair_bandwidth: Mapping[str, float] | None = None
    error: str | None = None


def pairs(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """The neighbouring pairs ``(nodes[i], nodes[i+1 mod n])`` whose all-reduce is timed, in the
    order every node runs them (one pair for two nodes, none for one)."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [(nodes[0], nodes[1])]
    return [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]


def judge(checks: Mapping[str, NodeCheck], *, threshold: float) -> dict[str, str]:
    """``{node: reason}`` of the nodes that fail; empty when all pass.

    Args:
        checks: every checked node's report (the nodes' order is the pairs' order).
        threshold: > 1; see the module docstring.

    The digest rule needs a majority (more than half of the finished nodes agree); without one (two
    nodes that disagree) no node fails on its digest. The network rule needs three nodes or more (two
    nodes form one pair, and a slow pair names no node).
    """
    failed = {n: f"check did not finish: {c.error}" for n, c in checks.items() if c.error is not None}
    done = {n: c for n, c in checks.items() if c.error is None}
    if not done:
        return failed
    digest, votes = Counter(c.digest for c in done.values()).most_common(1)[0]
    if votes * 2 > len(done):
        for n, c in done.items():
            if c.digest != digest:
                failed[n] = f"its matmul result differs from {votes} of {len(done)} nodes' (a wrong answer)"
    median = statistics.median(c.compute_seconds for c in done.values())
    for n, c in done.items():
        if n not in failed and median > 0 and c.compute_seconds > threshold * median:
            failed[n] = (f"compute {c.compute_seconds * 1e3:.1f} ms is {c.compute_seconds / median:.1f}x the "
                         f"median {median * 1e3:.1f} ms (threshold {threshold:g})")
    if len(done) >= 3:
        bandwidth = {frozenset((a, b)): bw for a, c in done.items() for b, bw in (c.pair_bandwidth or {}).items()}
        best = {n: max((bw for key, bw in bandwidth.items() if n in key), default=None) for n in done}
        known = [bw for bw in best.values() if bw is not None]
        if known:
            floor = statistics.median(known) / threshold
            for n, bw in best.items():
                if n not in failed and bw is not None and bw < floor:
                    failed[n] = (f"all-reduce with either neighbour at most {bw / 1e6:.1f} MB/s, under the "
                                 f"median node's best / {threshold:g} = {floor / 1e6:.1f} MB/s")
    return failed


@dataclass(frozen=True)
class Baseline:
    """What the nodes that passed the first check measured, for judging a node that rejoins later.

    Attributes:
        digest: the majority's matmul digest.
        compute_seconds: the median compute time of the nodes that passed, seconds.
        bandwidth: the median all-reduce bandwidth of their pairs with each other, bytes per second
            (``None``: not measured).
    """

    digest: str
    compute_seconds: float
    bandwidth: float | None


def baseline(checks: Mapping[str, NodeCheck], failed: Mapping[str, str]) -> Baseline | None:
    """The :class:`Baseline` of the nodes of ``checks`` not in ``failed``; ``None`` when none passed."""
    ok = {n: c for n, c in checks.items() if n not in failed and c.error is None}
    if not ok:
        return None
    digest = Counter(c.digest for c in ok.values()).most_common(1)[0][0]
    measured = [bw for c in ok.values() for partner, bw in (c.pair_bandwidth or {}).items() if partner in ok]
    return Baseline(digest, statistics.median(c.compute_seconds for c in ok.values()),
                    statistics.median(measured) if measured else None)


def judge_against(check: NodeCheck, base: Baseline, *, threshold: float, network: bool = True) -> str | None:
    """Why a node that rejoins fails against the first check's ``base`` (``None``: it passes): the
    same rules as :func:`judge`, with the baseline in place of the other nodes; ``network=False``
    leaves the link to :func:`judge` over the rejoin check's own ring (a reference pair measured at
    the same time, under the same load, is fairer than a baseline measured on idle nodes)."""
    if check.error is not None:
        return f"check did not finish: {check.error}"
    if check.digest != base.digest:
        return "its matmul result differs from the nodes' that passed the first check (a wrong answer)"
    if base.compute_seconds > 0 and check.compute_seconds > threshold * base.compute_seconds:
        return (f"compute {check.compute_seconds * 1e3:.1f} ms is {check.compute_seconds / base.compute_seconds:.1f}x "
                f"the first check's median {base.compute_seconds * 1e3:.1f} ms (threshold {threshold:g})")
    if network and base.bandwidth and check.pair_bandwidth:
        best = max(check.pair_bandwidth.values())
        if best < base.bandwidth / threshold:
            return (f"all-reduce at most {best / 1e6:.1f} MB/s, under the first check's median pair / {threshold:g} "
                    f"= {base.bandwidth / threshold / 1e6:.1f} MB/s")
    return None
