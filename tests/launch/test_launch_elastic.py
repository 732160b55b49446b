"""Elastic resharding both ways under ``lifeline run`` (issue 12): a node lost with no room left shrinks
the job, reading the restore step from the surviving sidecars' memory; the node's return grows it back
to the spec's size, again from memory; the job finishes."""

from __future__ import annotations

from ._jobs import job_doc, lifeline_run, trainer_events, write_job


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
