"""lifeline.control.health.judge: which nodes fail the health check (pure; docs/health.md).

The end-to-end test (tests/launch/test_health.py) runs the real checks; these draw the reports:
node counts, which node is bad and how, and healthy noise, from seeded RNGs.
"""

from __future__ import annotations

import random

import pytest

from lifeline.control.health import NodeCheck, baseline, judge, judge_against, pairs

GOOD = "a" * 64


def _reports(n: int, rng: random.Random, *, noise: float = 0.3) -> dict[str, NodeCheck]:
    """``n`` healthy nodes: equal digests, compute 10 ms ± noise, every pair ~500 MB/s ± noise."""
    names = [f"node-{i}" for i in range(n)]
    bw = {frozenset(p): 5e8 * rng.uniform(1 - noise, 1 + noise) for p in pairs(names)}
    return {m: NodeCheck(GOOD, 0.010 * rng.uniform(1 - noise, 1 + noise),
                         {o: v for p, v in bw.items() if m in p for o in p if o != m}) for m in names}


def _slow_link(reports: dict[str, NodeCheck], bad: str, factor: float) -> dict[str, NodeCheck]:
    """Every all-reduce ``bad`` takes part in runs ``factor`` times slower (both ends measure it)."""
    out = {}
    for m, c in reports.items():
        bw = {o: (v / factor if bad in (m, o) else v) for o, v in (c.pair_bandwidth or {}).items()}
        out[m] = NodeCheck(c.digest, c.compute_seconds, bw)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_healthy_nodes_with_noise_all_pass(seed):
    rng = random.Random(seed)
    assert judge(_reports(rng.randrange(1, 12), rng), threshold=2.0) == {}


@pytest.mark.parametrize("seed", range(20))
def test_one_bad_node_of_each_kind_is_the_only_one_failed(seed):
    rng = random.Random(seed)
    n = rng.randrange(3, 12)
    reports = _reports(n, rng)
    bad = f"node-{rng.randrange(n)}"
    kind = rng.choice(["compute", "slow", "network"])
    if kind == "compute":
        reports[bad] = NodeCheck("b" * 64, reports[bad].compute_seconds, reports[bad].pair_bandwidth)
    elif kind == "slow":
        reports[bad] = NodeCheck(GOOD, reports[bad].compute_seconds * 4, reports[bad].pair_bandwidth)
    else:
        reports = _slow_link(reports, bad, 7.0)
    failed = judge(reports, threshold=2.0)
    assert list(failed) == [bad], (kind, n, failed)
    assert {"compute": "differs", "slow": "median", "network": "all-reduce"}[kind] in failed[bad]


def test_pairs_are_a_ring_one_pair_for_two_nodes_none_for_one():
    assert pairs(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert pairs(["a", "b"]) == [("a", "b")]
    assert pairs(["a"]) == []


def test_two_nodes_that_disagree_fail_on_no_digest_and_a_slow_pair_names_no_node():
    rng = random.Random(1)
    reports = _slow_link(_reports(2, rng), "node-1", 10.0)
    reports["node-1"] = NodeCheck("b" * 64, reports["node-1"].compute_seconds, reports["node-1"].pair_bandwidth)
    assert judge(reports, threshold=2.0) == {}


def test_a_check_that_did_not_finish_fails_its_node_and_the_others_are_judged_without_it():
    rng = random.Random(2)
    reports = _reports(4, rng)
    reports["node-3"] = NodeCheck(error="timed out: ")
    reports["node-1"] = NodeCheck("b" * 64, reports["node-1"].compute_seconds, reports["node-1"].pair_bandwidth)
    failed = judge(reports, threshold=2.0)
    assert set(failed) == {"node-1", "node-3"} and "did not finish" in failed["node-3"]


@pytest.mark.parametrize("seed", range(12))
def test_a_node_that_rejoins_is_judged_against_the_first_checks_baseline(seed):
    rng = random.Random(seed)
    n = rng.randrange(3, 10)
    first = _reports(n, rng)
    base = baseline(first, {})
    assert base is not None and base.digest == GOOD
    partner = sorted(first)[0]
    healthy = NodeCheck(GOOD, 0.010 * rng.uniform(0.7, 1.3), {partner: 5e8 * rng.uniform(0.7, 1.3)})
    assert judge_against(healthy, base, threshold=2.0) is None
    kind = rng.choice(["compute", "slow", "network", "error"])
    bad = {"compute": NodeCheck("b" * 64, healthy.compute_seconds, healthy.pair_bandwidth),
           "slow": NodeCheck(GOOD, healthy.compute_seconds * 4, healthy.pair_bandwidth),
           "network": NodeCheck(GOOD, healthy.compute_seconds, {partner: 5e8 / 7}),
           "error": NodeCheck(error="exit 1: boom")}[kind]
    reason = judge_against(bad, base, threshold=2.0)
    assert reason is not None and {"compute": "differs", "slow": "median", "network": "all-reduce",
                                   "error": "did not finish"}[kind] in reason, (kind, reason)


def test_the_baseline_leaves_out_failed_nodes_and_their_pairs():
    rng = random.Random(3)
    first = _slow_link(_reports(5, rng), "node-2", 10.0)
    failed = judge(first, threshold=2.0)
    assert list(failed) == ["node-2"]
    base = baseline(first, failed)
    assert base is not None and base.bandwidth is not None and base.bandwidth > 5e8 * 0.7
    assert baseline({"node-0": NodeCheck(error="timed out")}, {}) is None
