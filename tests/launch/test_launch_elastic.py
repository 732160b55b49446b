"""Elastic resharding both ways under ``lifeline run`` (issue 12): a node lost with no room left shrinks
the job, reading the restore step from the surviving sidecars' memory; the node's return grows it back
to the spec's size, again from memory; the job finishes."""

from __future__ import annotations

import pytest

import shutil

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)


def test_a_lost_node_without_room_shrinks_from_memory_and_its_return_grows_the_job_back(tmp_path):
    doc = job_doc("elastic", steps=160)
    doc["spec"]["recovery"].update(nodeCooldownSeconds=1, elastic={"minReplicas": 2})
    job = write_job(tmp_path / "job.yaml", doc)
    state = tmp_path / "state"
    summary = lifeline_run(job, state, "--persist-uri", str(tmp_path / "l2"), "--spare-nodes", "0",
                           "--standby-nodes", "0", "--inject-failure", "node:rank=1:step=6",
                           "--node-return-seconds", "2")
    assert summary["phase"] == "Succeeded" and summary["step"] == 160
    reshards = [r for r in summary["recoveries"] if r["action"] == "Reshard"]
    assert [r["layout"]["data"] for r in reshards] == [1, 2], summary["recoveries"]
    shrink, grow = reshards
    assert shrink["failures"] and not grow["failures"]  # the grow answers no failure
    assert summary["layout"] == doc["spec"]["layout"] and summary["restarts"] == 1
    events = trainer_events(state)
    resharded = [e for e in events if e["event"] == "restore" and e.get("source") == "reshard"]
    by_gen = {}
    for e in resharded:
        by_gen.setdefault(e["generation"], []).append(e)
    assert sorted(by_gen) == [shrink["generation"], grow["generation"]]
    assert sorted(e["rank"] for e in by_gen[shrink["generation"]]) == [0, 1]
    assert sorted(e["rank"] for e in by_gen[grow["generation"]]) == [0, 1, 2, 3]
    for e in resharded:  # every chunk was in memory: nothing read from L2 (counted per tier)
        assert e["bytes_by_tier"]["L2"] == 0 and sum(e["bytes_by_tier"].values()) >= e["needed_bytes"] > 0, e
    # ranks 2 and 3 left the layout at the shrink and said so; rank 0 kept its process (adopted in place)
    retired = {e["rank"] for e in events if e["event"] == "retired"}
    assert retired <= {2, 3}
    assert any(e["event"] == "relayout" and e["rank"] == 0 for e in events)


def _losses(state, min_generation: int = 0) -> dict[int, float]:
    """The loss of each step as the last stage reported it, from generation ``min_generation`` on."""
    out = {}
    for e in trainer_events(state):
        if e["event"] == "step" and e.get("loss") is not None and e["generation"] >= min_generation:
            out[e["step"]] = e["loss"]
    return out


def test_training_continued_after_a_reshard_tracks_the_job_started_in_that_layout(tmp_path):
    """A job that shrank from memory at step s trains on in the new layout exactly as the same job
    started in that layout from step s's checkpoint in L2: the same loss at every step after s."""
    doc = job_doc("track", steps=14)
    doc["spec"]["checkpoint"]["persist"]["every"] = 1  # every step in L2: the second run starts from step s
    first = lifeline_run(write_job(tmp_path / "a.yaml", doc), tmp_path / "a", "--persist-uri", str(tmp_path / "l2a"),
                         "--spare-nodes", "0", "--standby-nodes", "0", "--inject-failure", "node:rank=1:step=6")
    reshard = next(r for r in first["recoveries"] if r["action"] == "Reshard")
    s = reshard["restore_step"]
    assert first["phase"] == "Succeeded" and first["layout"]["data"] == 1 and s is not None and s >= 1
    l2 = tmp_path / "l2b"
    shutil.copytree(tmp_path / "l2a", l2)
    for step_dir in (l2 / "track").iterdir():  # the second run sees L2 as it was at step s
        if step_dir.is_dir() and step_dir.name.isdigit() and int(step_dir.name) > s:
            shutil.rmtree(step_dir)
    small = job_doc("track", data=1, steps=14)
    second = lifeline_run(write_job(tmp_path / "b.yaml", small), tmp_path / "b", "--persist-uri", str(l2))
    assert second["phase"] == "Succeeded" and second["resumed_from"] == s
    after, started = _losses(tmp_path / "a", reshard["generation"]), _losses(tmp_path / "b")
    assert sorted(after) == sorted(started) == list(range(s + 1, 15))
    for step in after:  # bit for bit, hence to any printed precision
        assert after[step] == started[step], (step, after[step], started[step])
    boundary = _losses(tmp_path / "a")
    print(f"TRACK s={s} loss at s (layout A) {boundary.get(s)}; at s+1 after the reshard {after[s + 1]} "
          f"= started in B {started[s + 1]}")
