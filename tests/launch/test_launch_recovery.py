"""Acceptance: ``lifeline run`` with real processes, real Redis, real gloo (DESIGN.md invariant 1).

A failure-free reference run; the same spec with failures injected at seeded random steps (a
trainer crash; a node loss plus a trainer crash in one run) ends with bit-identical final
parameters; killing everything and starting again with the same state dir resumes from L2 with
the same result; restarting with a smaller layout (DP 2 -> 1) resumes by resharding and the loss
continues without a jump.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest

from lifeline.devcluster import ProcessRef
from lifeline.launch.inject import random_injections

from ._jobs import (
    PERSIST_EVERY,
    STEPS,
    await_condition,
    job_doc,
    lifeline_run,
    start_run,
    trainer_events,
    write_job,
)

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

WORLD = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The failure-free run: summary, state dir and L2 directory."""
    root = tmp_path_factory.mktemp("reference")
    job = write_job(root / "job.yaml", job_doc("ref"))
    summary = lifeline_run(job, root / "state", "--persist-uri", str(root / "l2"))
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    assert summary["digest"]["source"] == "L2" and summary["digest"]["step"] == STEPS
    # no trainer finished before the final checkpoint was committed to L2 (its manifest is written last)
    (manifest,) = (root / "l2").rglob(f"{STEPS:012d}/manifest.json")
    done = [e for e in trainer_events(root / "state") if e.get("event") == "done"]
    assert len(done) == WORLD and min(e["time"] for e in done) >= manifest.stat().st_mtime - 1e-3, (
        manifest.stat().st_mtime, done)
    return summary, root


def _losses(state_dir: Path) -> dict[int, float]:
    """Mean loss reported per step (by the last pipeline stage's ranks)."""
    by: dict[int, list[float]] = {}
    for e in trainer_events(state_dir):
        if e.get("event") == "step" and e.get("loss") is not None:
            by.setdefault(e["step"], []).append(e["loss"])
    return {s: sum(v) / len(v) for s, v in by.items()}


def test_trainer_crash_restarts_in_place_and_ends_bit_identical(reference, tmp_path):
    ref, _ = reference
    (crash,) = random_injections(11, ("trainer",), world_size=WORLD, steps=STEPS)
    job = write_job(tmp_path / "job.yaml", job_doc("crash"))
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"), "--inject-failure",
                           str(crash))
    assert summary["phase"] == "Succeeded"
    (rec,) = summary["recoveries"]
    assert rec["action"] == "RestartInPlace" and rec["tier"] == "L0" and rec["ranks"] == [crash.rank]
    assert rec["steps_lost"] <= 1 and rec["seconds"] is not None
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def test_a_crash_before_any_checkpoint_restarts_everyone_from_the_initial_state_in_their_processes(
        reference, tmp_path):
    """No copy exists yet (the first checkpoint is the last step's): a trainer crash at step 3 is a
    Rollback to the initial state, which the survivors (data parallel 2: they have sub-groups) load
    in their processes. Fuzz seeds 503 and 505: they built and connected a second trainer, a
    ``new_group`` round the restarted rank never made, and sat in it until the engine saw a hang."""
    ref, _ = reference
    doc = job_doc("norestore")
    doc["spec"]["checkpoint"].update(every=STEPS, persist={"every": STEPS, "uri": "file:///unused"})
    summary = lifeline_run(write_job(tmp_path / "job.yaml", doc), tmp_path / "state", "--persist-uri",
                           str(tmp_path / "l2"), "--inject-failure", "trainer:rank=1:step=3")
    assert summary["phase"] == "Succeeded"
    (rec,) = summary["recoveries"]  # one recovery: no hang after it
    assert (rec["action"], rec["restore_step"], rec["ranks"]) == ("Rollback", None, [1]), rec
    restores = [e for e in trainer_events(tmp_path / "state") if e["event"] == "restore" and e["generation"] == 1]
    assert sorted(e["rank"] for e in restores) == [0, 2, 3] and {e["source"] for e in restores} == {"init"}
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def test_node_loss_and_trainer_crash_in_one_run_end_bit_identical(reference, tmp_path):
    ref, _ = reference
    node, crash = random_injections(23, ("node", "trainer"), world_size=WORLD, steps=STEPS)
    job = write_job(tmp_path / "job.yaml", job_doc("twofail"))
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"),
                           "--inject-failure", str(node), "--inject-failure", str(crash))
    assert summary["phase"] == "Succeeded"
    actions = [(r["action"], r["tier"]) for r in summary["recoveries"]]
    assert actions == [("ReplacePods", "L1"), ("RestartInPlace", "L0")], summary["recoveries"]
    assert summary["recoveries"][0]["ranks"] == [node.rank]
    assert all(r["steps_lost"] <= 1 for r in summary["recoveries"])
    # the lost node's rank came back on another node, restored from its peer's L1 copy
    restores = [e for e in trainer_events(tmp_path / "state") if e.get("event") == "restore" and e["rank"] == node.rank]
    assert restores, "the replacement trainer never restored"
    assert list((tmp_path / "state" / "logs").glob(f"rank-{node.rank}-node-{WORLD}*-trainer.log"))
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def _run_processes(record: Path) -> list[ProcessRef]:
    """The live processes a run's ``processes.json`` names. A pid whose process started after the
    file was written is a stranger that took the number of one of the run's exited processes."""
    written = record.stat().st_mtime
    pids = json.loads(record.read_text())
    out = []
    for pid in [pids["launcher"], pids["redis"]] + [p for r in pids["ranks"].values() for p in r.values()]:
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            continue
        if started <= written + 0.02:  # clock ticks (10 ms); psutil's boot time rounds down, never up
            out.append(ProcessRef.of(pid))
    return out


def test_kill_everything_and_start_again_resumes_from_l2(reference, tmp_path):
    ref, _ = reference
    job = write_job(tmp_path / "job.yaml", job_doc("killall"))
    state, l2 = tmp_path / "state", tmp_path / "l2"
    # a trainer crash after step 2*PERSIST_EVERY holds the job still while everything is killed
    hold = f"trainer:rank=0:step={2 * PERSIST_EVERY + 1}"
    proc = start_run(job, state, "--persist-uri", str(l2), "--inject-failure", hold, log=tmp_path / "first.log")
    try:
        manifest = l2 / "killall" / f"{2 * PERSIST_EVERY:012d}" / "manifest.json"
        await_condition(lambda: manifest.exists() and "injecting" in (tmp_path / "first.log").read_text(), 300,
                        "L2 step 8 and the injected crash")
        everything = _run_processes(state / "processes.json")
        for process in everything:
            process.signal(signal.SIGKILL)
        proc.wait(timeout=30)
        await_condition(lambda: not any(p.alive() for p in everything), 30, "every process to die")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert max(int(p.name) for p in (l2 / "killall").iterdir() if (p / "manifest.json").exists()) < STEPS
    summary = lifeline_run(job, state, "--persist-uri", str(l2))
    assert summary["phase"] == "Succeeded"
    assert summary["resumed_from"] is not None and PERSIST_EVERY <= summary["resumed_from"] < STEPS
    assert summary["digest"] == ref["digest"], "the resumed run's final parameters differ from the reference"


@pytest.mark.parametrize("layout", [
    {"tensor": 1, "pipeline": 2, "data": 1, "expert": 1},  # fewer replica groups
    {"tensor": 2, "pipeline": 2, "data": 1, "expert": 1},  # data down, tensor up
    {"tensor": 1, "pipeline": 1, "data": 2, "expert": 2},  # pipeline down, expert up
], ids=["data", "tensor", "pipeline-expert"])
def test_a_job_restarted_in_another_layout_reshards_and_the_loss_continues(reference, tmp_path, layout):
    _, root = reference
    l2 = tmp_path / "l2"
    shutil.copytree(root / "l2", l2)  # the reference's checkpoints (layout PP=2 x DP=2)
    doc = job_doc("ref", steps=STEPS + 4)  # the same job in another layout
    doc["spec"].update(layout=layout, replicas=layout["tensor"] * layout["pipeline"] * layout["data"] * layout["expert"])
    job = write_job(tmp_path / "job.yaml", doc)
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(l2))
    assert summary["phase"] == "Succeeded" and summary["resumed_from"] == STEPS
    assert summary["layout"] == layout and summary["step"] == STEPS + 4
    before, after = _losses(root / "state"), _losses(tmp_path / "state")
    assert min(after) == STEPS + 1, "training did not continue at the step after the restored one"
    first = after[STEPS + 1]
    drop = before[1] - before[STEPS]  # what training achieved so far
    assert drop > 0.2
    assert abs(first - before[STEPS]) < 0.25 * drop, (first, before[STEPS], before[1])


def test_a_node_lost_after_the_other_ranks_finished_is_a_recovery_they_take_part_in(reference, tmp_path):
    """A late failure (issue 26, the cluster bed's trial 2006): rank 1's node is lost at the last step,
    after ranks 0, 2 and 3 reported ``done`` (the injection fires only then). The finished ranks have not
    exited (``JobEnd``): they rejoin the new generation in their processes, restore the final step and
    finish again; on Kubernetes nothing restarts a trainer that exited 0, so before they had to be
    running. Also a fresh trainer process restoring a two-digit step: its own initial state's
    variable-length byte entries (the data loader's JSON position, ``0``) differ in length from the
    stored ones (``12``), so the restore must lay out byte entries by the stored metadata."""
    ref, _ = reference
    job = write_job(tmp_path / "job.yaml", job_doc("late"))
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"),
                           "--inject-failure", f"node:rank=1:step={STEPS}")
    assert summary["phase"] == "Succeeded"
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["ranks"], rec["restore_step"]) == ("ReplacePods", [1], STEPS), rec
    events = trainer_events(tmp_path / "state")
    for rank in (0, 2, 3):
        mine = [(e["event"], e["generation"]) for e in events if e.get("rank") == rank]
        assert [ev for ev, _ in mine].count("init") == 1, f"rank {rank} was restarted: {mine}"
        assert mine.index(("done", 0)) < mine.index(("restore", 1)) < mine.index(("done", 1)), mine
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def test_spares_take_over_in_place_and_on_a_replacement_node_and_the_run_ends_bit_identical(reference, tmp_path):
    """With a warm pool, the crashed trainer restarts in its node's pre-warmed spare and the lost
    node's rank starts in the standby node's spare sidecar and trainer; the result is unchanged."""
    ref, _ = reference
    job = write_job(tmp_path / "job.yaml", job_doc("spares"))
    state = tmp_path / "state"
    summary = lifeline_run(job, state, "--persist-uri", str(tmp_path / "l2"), "--warm-start",
                           "--inject-failure", "trainer:rank=1:step=3", "--inject-failure", "node:rank=2:step=7")
    assert summary["phase"] == "Succeeded"
    got = [(r["action"], r["tier"], r["ranks"], r["spares"]) for r in summary["recoveries"]]
    assert got == [("RestartInPlace", "L0", [1], 1), ("ReplacePods", "L1", [2], 1)], summary["recoveries"]
    assert all(r["steps_lost"] <= 1 for r in summary["recoveries"])

    def lines(name: str) -> list[dict]:
        text = (state / "logs" / name).read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    # both incarnations of rank 1 are spares (the first forked from the template, the in-place one the
    # node's waiting spare, counted in the record above): each assigned, then the runtime's init
    in_place = lines("rank-1-node-1-trainer.log")
    assigned = [i for i, e in enumerate(in_place) if e["event"] == "spare_assigned"]
    assert len(assigned) == 2 and [in_place[i + 1]["event"] for i in assigned] == ["init", "init"]
    assert [in_place[i + 1]["generation"] for i in assigned] == [0, 1]
    assert in_place[assigned[0]]["pid"] != in_place[assigned[1]]["pid"]
    # rank 2 on the standby node: both containers came from spares, and the trainer restored step 7's
    # shard from its peer's L1 copy through the new sidecar
    sidecar, trainer = lines(f"rank-2-node-{WORLD}-sidecar.log"), lines(f"rank-2-node-{WORLD}-trainer.log")
    assert sidecar[0]["event"] == "spare_assigned" and trainer[0]["event"] == "spare_assigned"
    restores = [e for e in trainer if e["event"] == "restore"]
    assert [(e["generation"], e["step"]) for e in restores] == [(2, summary["recoveries"][1]["restore_step"])]
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"


def test_a_survivor_stuck_in_the_old_generation_is_restarted_in_place_and_the_run_ends_bit_identical(
        reference, tmp_path):
    """Rank 2 is frozen (SIGSTOP) and rank 1 crashes in the same step: rank 2 never reads the plan
    (nor does a survivor blocked in a collective with it: a frozen process keeps its sockets open),
    so the supervisor kills them and starts them again in their nodes' spares, within the same plan
    (no second generation)."""
    ref, _ = reference
    job = write_job(tmp_path / "job.yaml", job_doc("stuck"))
    summary = lifeline_run(job, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"), "--warm-start",
                           "--inject-failure", "hang:rank=2:step=4", "--inject-failure", "trainer:rank=1:step=4")
    assert summary["phase"] == "Succeeded"
    (rec,) = summary["recoveries"]
    assert rec["action"] == "RestartInPlace" and rec["ranks"] == [1], rec
    # the frozen rank, and any survivor blocked in a collective with it (its sockets stay open)
    assert 2 in rec["stuck"] and set(rec["stuck"]) <= {0, 2, 3}, rec
    for rank in rec["stuck"]:
        restores = [e for e in trainer_events(tmp_path / "state") if e.get("event") == "restore" and e["rank"] == rank]
        assert [e["generation"] for e in restores] == [1], f"stuck rank {rank} did not rejoin the plan's generation"
    assert summary["digest"] == ref["digest"], "final parameters differ from the failure-free run"
