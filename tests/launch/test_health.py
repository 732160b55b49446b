"""Health checks before start (issue 27), end to end: a node that fails its check is never used.

2 pipeline stages, 7 nodes (2 for the ranks, 5 spare). Three nodes are made to fail, one per kind of
fault (a wrong matmul result, a 4x slower compute, a slow all-reduce link); which node gets which
kind is drawn from a seeded RNG (``LIFELINE_HEALTH_TEST_SEED``, default 5). A node loss then forces a
replacement, which must also land on a healthy node. The run must end bit-identical to a
failure-free run without the check.
"""

from __future__ import annotations

import os
import random

import pytest

from ._jobs import job_doc, lifeline_run, write_job

WORLD, STEPS, NODES = 2, 8, 7
SEED = int(os.environ.get("LIFELINE_HEALTH_TEST_SEED", "5"))
QUIET = ("--spares-per-node", "0")  # no spares warming on the shared cores meanwhile


def _doc(name: str, check: bool) -> dict:
    doc = job_doc(name, pipeline=WORLD, data=1, steps=STEPS)
    doc["spec"]["checkpoint"].update(every=1, persist={"every": STEPS, "uri": "file:///unused"})
    doc["spec"]["recovery"]["healthCheck"] = {"enabled": check}
    return doc


def test_nodes_that_fail_the_health_check_are_never_used(tmp_path):
    ref = lifeline_run(write_job(tmp_path / "ref.yaml", _doc("ref", False)), tmp_path / "ref",
                       "--persist-uri", str(tmp_path / "ref-l2"), *QUIET)
    assert ref["phase"] == "Succeeded" and ref["recoveries"] == [] and ref["health"] is None
    rng = random.Random(SEED)
    bad = dict(zip(rng.sample(range(NODES), 3), rng.sample(["compute", "slow", "network"], 3)))
    usable = [n for n in range(NODES) if n not in bad]
    lost_rank = rng.randrange(WORLD)
    summary = lifeline_run(
        write_job(tmp_path / "job.yaml", _doc("health", True)), tmp_path / "state",
        "--persist-uri", str(tmp_path / "l2"), "--spare-nodes", str(NODES - WORLD), *QUIET,
        *(a for n, kind in bad.items() for a in ("--unhealthy-node", f"node-{n}:{kind}")),
        "--inject-failure", f"node:rank={lost_rank}:step={STEPS // 2}")
    assert summary["phase"] == "Succeeded", summary
    failed = summary["health"]["failed"]
    assert set(failed) == {f"node-{n}" for n in bad}, (bad, failed)
    words = {"compute": "differs", "slow": "median", "network": "all-reduce"}
    for n, kind in bad.items():
        assert words[kind] in failed[f"node-{n}"], (kind, failed[f"node-{n}"])
    (rec,) = summary["recoveries"]
    assert rec["action"] == "ReplacePods" and rec["ranks"] == [lost_rank], rec
    logs = sorted(p.name for p in (tmp_path / "state" / "logs").iterdir())
    on = {n: [name for name in logs if f"-node-{n}-" in name] for n in range(NODES)}
    assert not any(on[n] for n in bad), f"a failed node was used: {on}"
    first = {rank: usable[rank] for rank in range(WORLD)}
    assert all(on[first[rank]] for rank in range(WORLD)), f"rank r starts on the r-th healthy node: {on}"
    moved = [n for n in usable if n not in first.values() and any(f"rank-{lost_rank}-" in x for x in on[n])]
    assert moved, f"the lost rank's replacement ran on no other healthy node: {on}"
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


REJOIN_KIND = random.Random(SEED).choice(["compute", "slow", "network"])
REJOIN_STEPS = 240  # the healthy node is back and checked (about 5 s) well before the last step


@pytest.mark.parametrize("fault", [None, REJOIN_KIND], ids=["healthy", f"fails-{REJOIN_KIND}"])
def test_a_lost_node_that_comes_back_is_checked_before_the_job_grows_onto_it(tmp_path, fault):
    """An elastic job (pipeline 2 x data 2, no spare node) loses node-1 at step 6 and shrinks; node-1
    comes back 2 s later and runs the check with a node that passed. Healthy, the job grows back onto
    it; failing (the kind drawn from the seed), it is never used again and the job ends at data 1 (a
    check still running when the job ends is awaited: its verdict is in the summary either way)."""
    doc = job_doc("rejoin", steps=REJOIN_STEPS)
    doc["spec"]["recovery"].update(nodeCooldownSeconds=1, elastic={"minReplicas": 2}, healthCheck={"enabled": True})
    unhealthy = () if fault is None else ("--unhealthy-node", f"node-1:{fault}:rejoin")
    summary = lifeline_run(write_job(tmp_path / "job.yaml", doc), tmp_path / "state", "--persist-uri",
                           str(tmp_path / "l2"), "--spare-nodes", "0", "--standby-nodes", "0", *unhealthy,
                           "--inject-failure", "node:rank=1:step=6", "--node-return-seconds", "2")
    assert summary["phase"] == "Succeeded" and summary["step"] == REJOIN_STEPS
    health = summary["health"]
    assert health["failed"] == {}, health  # node-1 passed its first check: the fault is for its return
    reshards = [r["layout"]["data"] for r in summary["recoveries"] if r["action"] == "Reshard"]
    if fault is None:
        assert health["rejoins"] == {"node-1": "passed"} and reshards == [1, 2], (health, summary["recoveries"])
    else:
        words = {"compute": "differs", "slow": "median", "network": "all-reduce"}[fault]
        assert list(health["rejoins"]) == ["node-1"] and words in health["rejoins"]["node-1"], health
        assert reshards == [1] and summary["layout"]["data"] == 1, summary["recoveries"]
