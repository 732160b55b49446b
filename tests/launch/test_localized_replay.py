"""Acceptance: localized replay (MoEvement) with ``lifeline run``: real processes, Redis, gloo, sidecars.

A 3-stage pipeline (one rank per stage, 4 micro-batches per step: more micro-batches than stages,
so log keys of one step differ only by micro-batch), warm-up + cosine learning rate and global
gradient-norm clipping on, checkpoints every 4 steps, ``recovery.localizedReplay`` on. Each run
with failures ends bit-identical to the failure-free run, and the ranks of the stages that did not
fail never restore: they keep their state and wait while the failed stage restores its latest copy
and replays from its neighbours' upstream logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

STAGES = 3


def _doc(name: str, *, fault_in_replay: str | None = None, schedule: str = "gpipe") -> dict:
    doc = job_doc(name, pipeline=STAGES, data=1)
    spec = doc["spec"]
    spec["model"]["args"].update(n_layers=STAGES, micro_batches=4, grad_clip=0.5, warmup_steps=3,
                                 schedule=schedule)
    spec["checkpoint"]["every"] = 4
    spec["recovery"]["localizedReplay"] = True
    spec["recovery"].pop("elastic")
    if fault_in_replay:
        env = spec["template"]["spec"]["containers"][0]["env"]
        env.append({"name": "LIFELINE_FAULT_IN_REPLAY", "value": fault_in_replay})
    return doc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref3")
    summary = lifeline_run(write_job(root / "job.yaml", _doc("ref3")), root / "state", "--persist-uri",
                           str(root / "l2"))
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    return summary


def _run(tmp_path: Path, name: str, *injections: str, fault_in_replay: str | None = None,
         schedule: str = "gpipe") -> dict:
    args = [a for inj in injections for a in ("--inject-failure", inj)]
    return lifeline_run(write_job(tmp_path / "job.yaml", _doc(name, fault_in_replay=fault_in_replay,
                                                              schedule=schedule)),
                        tmp_path / "state", "--persist-uri", str(tmp_path / "l2"), *args)


def _events(tmp_path: Path, event: str, generation: int | None = None) -> list[dict]:
    return [e for e in trainer_events(tmp_path / "state") if e.get("event") == event
            and (generation is None or e.get("generation") == generation)]


def _restored_ranks(tmp_path: Path, generation: int) -> set[int]:
    return {e["rank"] for e in _events(tmp_path, "restore", generation)}


def test_a_trainer_crash_in_the_middle_stage_replays_that_stage_alone(reference, tmp_path):
    summary = _run(tmp_path, "mid", "trainer:rank=1:step=7")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"], rec["ranks"]) == ("LocalizedReplay", "L0", 4, [1])
    assert _restored_ranks(tmp_path, 1) == {1}, "only the failed stage may restore"
    assert {e["rank"] for e in _events(tmp_path, "keep", 1)} == {0, 2}
    assert rec["from_step"] == 7, "the kill lands at step 7 (rank 1 holds there until it does)"
    assert sorted(e["step"] for e in _events(tmp_path, "replay", 1)) == [5, 6, 7]
    (done,) = _events(tmp_path, "replayed", 1)
    assert (done["rank"], done["step"], done["steps"]) == (1, 7, 3) and done["log_bytes"] > 0
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"


def test_a_middle_stage_crash_under_1f1b_replays_that_stage_alone_bit_identically(reference, tmp_path):
    """Schedule 1F1B: a trainer crash in the middle stage, whose logs were written in 1F1B order,
    replays that stage alone and ends bit-identical to the failure-free run. The reference is the
    GPipe run: a failure-free 1F1B run equals it bit for bit (both accumulate gradients in
    micro-batch order; tests/models/test_gpt_moe_1f1b.py), so one run less here."""
    summary = _run(tmp_path, "mid1f1b", "trainer:rank=1:step=7", schedule="1f1b")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"], rec["ranks"]) == ("LocalizedReplay", "L0", 4, [1])
    assert _restored_ranks(tmp_path, 1) == {1} and {e["rank"] for e in _events(tmp_path, "keep", 1)} == {0, 2}
    assert rec["from_step"] == 7, rec
    (done,) = _events(tmp_path, "replayed", 1)  # the kill lands at step 7: rank 1 holds there until it does
    assert (done["rank"], done["step"], done["steps"]) == (1, 7, 3) and done["log_bytes"] > 0
    assert sorted(e["step"] for e in _events(tmp_path, "replay", 1)) == [5, 6, 7]
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"


def test_a_node_loss_of_one_stage_restores_from_the_peer_copy_and_replays(reference, tmp_path):
    summary = _run(tmp_path, "node", "node:rank=1:step=7")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"]) == ("LocalizedReplay", "L1", 4)
    assert _restored_ranks(tmp_path, 1) == {1}
    assert summary["digest"] == reference["digest"]


def test_two_failures_in_different_windows_each_replay_locally(reference, tmp_path):
    summary = _run(tmp_path, "two", "trainer:rank=1:step=5", "trainer:rank=2:step=10")
    actions = [(r["action"], r["restore_step"], r["ranks"]) for r in summary["recoveries"]]
    assert actions == [("LocalizedReplay", 4, [1]), ("LocalizedReplay", 8, [2])]
    # the second replay reads stage 1's log of steps 9..10, which stage 1 wrote after its own replay
    assert _restored_ranks(tmp_path, 1) == {1} and _restored_ranks(tmp_path, 2) == {2}
    assert summary["digest"] == reference["digest"]


def test_a_failure_during_the_replay_falls_back_to_a_global_restore(reference, tmp_path):
    summary = _run(tmp_path, "fir", "trainer:rank=1:step=7", fault_in_replay="1:6")
    actions = [(r["action"], r["restore_step"]) for r in summary["recoveries"]]
    assert actions == [("LocalizedReplay", 4), ("RestartInPlace", 4)]
    assert [e["step"] for e in _events(tmp_path, "replay", 1)] == [5], "the replay died before step 6"
    assert _restored_ranks(tmp_path, 2) == {0, 1, 2}, "after the failed replay every rank restores"
    assert summary["digest"] == reference["digest"]


def test_a_stage_with_two_replicas_replays_with_its_data_parallel_all_reduce(tmp_path):
    """Pipeline 2 x data 2: a node loss in stage 0 makes both of its replicas restore and replay
    together (their gradient all-reduce runs during the replay); stage 1 keeps its state."""
    def doc(name: str, localized: bool) -> dict:
        d = job_doc(name)
        d["spec"]["checkpoint"]["every"] = 4
        d["spec"]["recovery"]["localizedReplay"] = localized
        return d

    ref = lifeline_run(write_job(tmp_path / "ref.yaml", doc("dpref", False)), tmp_path / "ref",
                       "--persist-uri", str(tmp_path / "l2ref"))
    summary = lifeline_run(write_job(tmp_path / "job.yaml", doc("dploc", True)), tmp_path / "state",
                           "--persist-uri", str(tmp_path / "l2"), "--inject-failure", "node:rank=1:step=7")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"]) == ("LocalizedReplay", "L1", 4)
    assert _restored_ranks(tmp_path, 1) == {0, 1}
    assert {e["rank"] for e in _events(tmp_path, "keep", 1)} == {2, 3}
    assert summary["digest"] == ref["digest"]


def _sparse_run(tmp_path: Path, name: str, *injections: str, fault_in_replay: str | None = None,
                schedule: str = "gpipe") -> dict:
    """Sparse checkpoints (window 3) and no dense checkpoint before the end: a failed stage can only
    restore from its sparse window, held in its sidecar's log store and its L1 peer's."""
    doc = _doc(name, fault_in_replay=fault_in_replay, schedule=schedule)
    doc["spec"]["checkpoint"]["every"] = doc["spec"]["checkpoint"]["persist"]["every"] = doc["spec"]["steps"]
    doc["spec"]["checkpoint"]["sparse"] = {"window": 3}
    args = [a for inj in injections for a in ("--inject-failure", inj)]
    return lifeline_run(write_job(tmp_path / "job.yaml", doc), tmp_path / "state", "--persist-uri",
                        str(tmp_path / "l2"), *args)


def test_a_crash_with_sparse_checkpoints_restores_the_window_and_replays_it_in_moevement_order(reference, tmp_path):
    summary = _sparse_run(tmp_path, "sparse", "trainer:rank=1:step=10")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["restore_step"], rec["ranks"]) == ("LocalizedReplay", 6, [1])
    (restore,) = _events(tmp_path, "restore", 1)
    assert restore["rank"] == 1 and restore["source"] == "window" and restore["window"] == 3
    # the kill lands at step 10: rank 1 holds there until it does
    assert rec["from_step"] == 10, rec
    assert sorted(e["step"] for e in _events(tmp_path, "replay", 1)) == [7, 8, 9, 10]
    steps = [e for e in _events(tmp_path, "step", 0) if e["rank"] == 1]
    # every step from the first window start on captures a slot (window 0 has no slot 0: none of it)
    assert steps and all((0 < e["slot_bytes"]) == (e["step"] >= 3) for e in steps), "every step captures a slot"
    assert summary["digest"] == reference["digest"], "final parameters differ from the failure-free run"


def test_a_node_loss_with_sparse_checkpoints_fetches_the_window_from_the_peer(reference, tmp_path):
    """Under 1F1B (bit-identical to the GPipe reference): the sparse operators, their window and the
    replay compose with the schedule."""
    summary = _sparse_run(tmp_path, "sparsenode", "node:rank=2:step=10", schedule="1f1b")
    (rec,) = summary["recoveries"]
    assert (rec["action"], rec["tier"], rec["restore_step"], rec["ranks"]) == ("LocalizedReplay", "L1", 6, [2])
    assert {e["rank"] for e in _events(tmp_path, "restore", 1) if e.get("source") == "window"} == {2}
    assert _restored_ranks(tmp_path, 1) == {2}
    assert summary["digest"] == reference["digest"]


def test_a_failure_during_a_sparse_replay_restores_every_rank_from_the_window(reference, tmp_path):
    """The global fallback needs no dense copy: every rank restores the window's first slot and
    re-runs, applying the later slots (online sparse-to-dense conversion), bit-identically."""
    summary = _sparse_run(tmp_path, "sparsefir", "trainer:rank=1:step=10", fault_in_replay="1:8")
    actions = [(r["action"], r["restore_step"]) for r in summary["recoveries"]]
    assert actions == [("LocalizedReplay", 6), ("RestartInPlace", 6)]
    restores = _events(tmp_path, "restore", 2)
    assert {e["rank"] for e in restores} == {0, 1, 2} and {e["source"] for e in restores} == {"window"}
    assert summary["digest"] == reference["digest"]
