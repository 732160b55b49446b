"""Preemption (issue 27): SIGTERM with a grace loses no step, end to end and in the engine.

The ``lifeline run`` test draws its configuration from a seeded RNG (``checkpoint.every`` in {1, 3},
the rank, and a step that is not a checkpoint step when ``every`` > 1, so the step-boundary agreement
must make every rank save it); ``LIFELINE_PREEMPT_TEST_SEED`` picks another draw. The unit tests
cover the parsing of ``preempt`` and the engine's plan.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from lifeline.api.recovery import Failure, FailureKind, RecoveryPlan
from lifeline.api.trainingjob import RecoveryAction
from lifeline.control.preemption import annotate, preempted
from lifeline.control.progress import Progress
from lifeline.errors import ConfigError
from lifeline.launch import _preempt as launch_preempt
from lifeline.launch.inject import PREEMPT_GRACE_SECONDS, hold_steps, parse_injection
from lifeline.runtime import _preempt as runtime_preempt

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

WORLD = 2
STEPS = 9  # a multiple of every every drawn: L2 persists the last step (the digest's source)
SEED = int(os.environ.get("LIFELINE_PREEMPT_TEST_SEED", "7"))


def _doc(name: str, every: int) -> dict:
    doc = job_doc(name, pipeline=1, data=WORLD, steps=STEPS)
    doc["spec"]["checkpoint"].update(every=every, persist={"every": STEPS, "uri": "file:///unused"})
    return doc


def _draw(seed: int) -> tuple[int, int, int]:
    """``(every, rank, step)``: a step in [2, STEPS - 1) that is not a checkpoint step when every > 1."""
    rng = random.Random(seed)
    every = rng.choice((1, 3))
    step = rng.choice([s for s in range(2, STEPS - 1) if every == 1 or s % every])
    return every, rng.randrange(WORLD), step


@pytest.mark.slow
def test_sigterm_with_a_10s_grace_loses_no_step_and_ends_bit_identical(tmp_path):
    ref = lifeline_run(write_job(tmp_path / "ref.yaml", _doc("ref", 1)), tmp_path / "ref",
                       "--persist-uri", str(tmp_path / "ref-l2"))
    assert ref["phase"] == "Succeeded" and ref["recoveries"] == [] and ref["digest"]["step"] == STEPS
    every, rank, step = _draw(SEED)
    fault = f"preempt:rank={rank}:step={step}:seconds=10"
    job = write_job(tmp_path / "job.yaml", _doc("pre", every))
    proc = subprocess.run([sys.executable, "-m", "lifeline", "run", str(job), "--state-dir", str(tmp_path / "state"),
                           "--json", "--persist-uri", str(tmp_path / "l2"), "--inject-failure", fault],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["phase"] == "Succeeded", summary
    said = " ".join(proc.stderr.split())  # the launcher's event lines, wrapped to the terminal's width
    assert (f"ReplacePods — preemption of rank {rank} (checkpointed step {step} to L1 before leaving): "
            "0 steps lost;") in said, proc.stderr[-4000:]
    (fired,) = summary["faults"]
    assert fired["kind"] == "preempt" and fired["note"].startswith("trainer exited 143"), fired
    (rec,) = summary["recoveries"]
    assert rec["action"] == "ReplacePods" and rec["ranks"] == [rank], rec
    assert rec["restore_step"] == step and rec["steps_lost"] == 0, (every, rec)  # 0 steps lost
    events = trainer_events(tmp_path / "state")
    (left,) = [e for e in events if e["event"] == "preempted"]
    assert (left["rank"], left["step"], left["saved_now"]) == (rank, step, every > 1), left
    assert "L1" in left["tiers"] and left["seconds"] < 10 - runtime_preempt.MARGIN_SECONDS, left
    restores = {(e["rank"], e["step"]) for e in events if e["event"] == "restore" and e["generation"] == 1}
    assert restores == {(r, step) for r in range(WORLD)}, restores  # every rank restored the saved step
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def test_preempt_parses_with_a_default_10s_grace_and_holds_its_rank():
    inj = parse_injection("preempt:rank=1:step=5", world_size=2, steps=9)
    assert (inj.kind, inj.rank, inj.step, inj.grace_seconds) == ("preempt", 1, 5, PREEMPT_GRACE_SECONDS)
    assert inj.loses_node and inj.holds and hold_steps([inj], 1) == (5,) and hold_steps([inj], 0) == ()
    timed = parse_injection("preempt:step=5:rank=0:seconds=2.5", world_size=2, steps=9)
    assert timed.grace_seconds == 2.5 and str(timed) == "preempt:rank=0:step=5:seconds=2.5"
    assert parse_injection(str(timed), world_size=2, steps=9) == timed


@pytest.mark.parametrize("text", ["preempt:step=5", "preempt:rank=1:step=9", "preempt:rank=1:step=5:seconds=0",
                                  "preempt:rank=1:step=5:tier=L1", "preempt:rank=2:step=5"])
def test_preempt_rejects_a_missing_rank_a_last_step_a_bad_grace_a_tier_and_a_rank_outside(text):
    with pytest.raises(ConfigError):
        parse_injection(text, world_size=2, steps=9)


def test_every_rank_gets_the_preemption_grace_and_the_runtime_reads_the_same_variable(tmp_path):
    from lifeline.launch._holds import hold_env

    injs = [parse_injection("preempt:rank=1:step=5:seconds=7", world_size=2, steps=9)]
    assert launch_preempt.PREEMPT_ENV == runtime_preempt.PREEMPT_ENV
    assert hold_env(injs, 0, tmp_path) == {runtime_preempt.PREEMPT_ENV: "7"}
    assert hold_env(injs, 1, tmp_path)[runtime_preempt.PREEMPT_ENV] == "7"
    assert runtime_preempt.Preemption.install(3, env={}) is None
    assert runtime_preempt.Preemption.install(3, env={runtime_preempt.PREEMPT_ENV: "nope"}) is None


def _plan(step: int | None, failures: tuple[Failure, ...], action=RecoveryAction.REPLACE_PODS) -> RecoveryPlan:
    from lifeline.api.trainingjob import LayoutSpec

    return RecoveryPlan(action=action, restore_step=step, layout=LayoutSpec(data=2), node_of_rank=("node-0", "node-2"),
                        restore_ranks=(0, 1), sources=(), restart_ranks=(), create_pods=(), delete_ranks=(),
                        reason="replacing pods of ranks [1]", generation=1, restarts=1, failures=failures,
                        cool_downs=())


def test_the_plan_after_a_preemption_says_so_and_counts_the_steps_lost():
    progress = Progress.of([_Report("preempted", 1, 0, 5), _Report("failure", 0, 0, 5)], 0)
    assert preempted(progress, 0) == {1: 5} and preempted(progress, 1) == {}
    lost = (Failure(FailureKind.NODE_LOST, (1,), "node-1", "Ready=False"),)
    plan = annotate(_plan(5, lost), preempted(progress, 0))
    assert plan.reason.startswith("preemption of rank 1 (checkpointed step 5 to L1 before leaving): 0 steps lost; ")
    assert "2 steps lost" in annotate(_plan(3, lost), {1: 5}).reason
    other = (Failure(FailureKind.NODE_LOST, (0,), "node-0", "Ready=False"),)
    assert annotate(_plan(5, other), {1: 5}).reason == "replacing pods of ranks [1]"  # not the rank that failed
    give_up = _plan(None, lost, RecoveryAction.GIVE_UP)
    assert annotate(give_up, {1: 5}) is give_up


def test_the_engine_restores_the_preempted_step_on_every_rank():
    """The engine's round after a preemption: rank 1's node is gone, its trainer reported ``preempted``
    at step 5 with its copy in L1 on rank 0's sidecar; rank 0 holds step 5 in L0."""
    from lifeline.api import load_trainingjob
    from lifeline.control import (CatalogFacts, ClusterState, Holding, NodeCondition, NodeState, Observed, Record,
                                  SidecarState, decide)

    spec = load_trainingjob(_doc("pre", 3)).spec
    holdings = frozenset({Holding(5, 0, "L0", 0), Holding(5, 1, "L1", 0), Holding(5, 1, "L0", 1),
                          Holding(3, 0, "L0", 0), Holding(3, 1, "L1", 0)})
    progress = Progress.of([_Report("preempted", 1, 0, 5), _Report("save", 0, 0, 5)], 0)
    facts = CatalogFacts(generation=0, progress=progress, holdings=holdings, registered={0: "node-0"},
                         complete_step=5)
    nodes = tuple(NodeState(f"node-{i}", capacity=1, ready=i != 1) for i in range(3))
    observed = Observed(node_of_rank=("node-0", "node-1"), cluster=ClusterState(nodes=nodes),
                        signals=(NodeCondition("node-1", False),), sidecars=(SidecarState(0, "node-0", 0.0),),
                        ready=frozenset({0}), catalog=facts)
    decision = decide(spec, Record(phase="Running"), observed, now=100.0)
    plan = decision.plan
    assert plan is not None and plan.action is RecoveryAction.REPLACE_PODS and plan.restore_step == 5, decision
    assert plan.node_of_rank[1] == "node-2" and "preemption of rank 1" in plan.reason and "0 steps lost" in plan.reason
    tiers = {s.rank: s.tier for s in plan.sources}
    assert tiers == {0: "L0", 1: "L1"}, plan.sources


class _Report:
    """A progress report as :meth:`Progress.of` reads it."""

    def __init__(self, event: str, rank: int, generation: int, step: int) -> None:
        self.event, self.rank, self.generation, self.step = event, rank, generation, step
        self.time, self.error = 50.0, ""
