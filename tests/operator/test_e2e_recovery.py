"""Recoveries of the operator on the dev cluster that end bit-identical to a failure-free run: an
elastic shrink and grow from memory, and a localized replay from a sparse window."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from _e2e import EXAMPLE, STEPS, _forget_l2, _get, _l2_digest, _reference_digest, _story, _wait

pytestmark = pytest.mark.cluster


@pytest.mark.slow
def test_elastic_job_shrinks_from_memory_when_a_lost_node_leaves_no_room_and_grows_back(devcluster,
                                                                                       operator_release):
    """3 ranks (data parallel 3), each pod requesting 3 of a node's 4 CPUs: one per node. Kill the
    node of rank 1: the two healthy nodes have room for two pods only, so the operator (node
    capacity from requests) reshards to data 2, keeping rank 0's pod, recreating rank 1's on rank 2's
    node and deleting rank 2's to make room. Start the node again:
    once its cool-down is over the operator grows the job back to data 3, again from memory, and
    the job finishes at the spec's size; each change is a status record and an event."""
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = "elastic"
    spec = body["spec"]
    # the grow must come before the last step: measured 2026-11-28 (load 3.5) the shrink resumed at step
    # ~12 and the grow 4 s later at step 55, then data 3 ran ~7 steps/s; 900 steps leave the grow 40 s
    # at 20 steps/s (the fastest seen) after the shrink, and the whole run ~2 min instead of ~4
    steps = 900
    spec.update(replicas=3, layout={"tensor": 1, "pipeline": 1, "data": 3, "expert": 1}, steps=steps)
    spec["recovery"]["hangTimeoutSeconds"] = 120
    spec["recovery"]["nodeCooldownSeconds"] = 5
    spec["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}
    _forget_l2(devcluster, "elastic")
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def status() -> dict:
        return _get(devcluster, "trainingjob", "elastic", "-n", ns).get("status") or {}

    def history(st: dict) -> list:
        return [(r["generation"], r["kind"], r["ranks"], r.get("fromStep"), r.get("tier")) for r in st.get("recoveries", [])]

    _wait("a complete checkpoint at step >= 12", lambda: (status().get("completeStep") or 0) >= 12, timeout=300)
    keeper = _get(devcluster, "pod", "elastic-0", "-n", ns)["metadata"]["uid"]
    victim = _get(devcluster, "pod", "elastic-1", "-n", ns)["spec"]["nodeName"]
    devcluster.kill_node(victim)
    try:
        try:
            shrunk = _wait("the job to run in data 2", lambda: (s := status()).get("phase") == "Running" and
                           (s.get("layout") or {}).get("data") == 2 and s, timeout=600)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{_story(devcluster, ns, 'elastic')}") from None
        # one pod fits a node: rank 1's new pod needs rank 2's node, so rank 2's pod (and the replica
        # of rank 1 its sidecar held) goes at once; what memory still holds is read from it, the rest from L2
        assert shrunk["recoveries"][-1]["kind"] == "Reshard", history(shrunk)
        assert _get(devcluster, "pod", "elastic-0", "-n", ns)["metadata"]["uid"] == keeper  # rank 0's pod stayed
    finally:
        devcluster.start_node(victim)
        devcluster.wait_nodes_ready(timeout=120)
    st = _wait("the job to finish", lambda: (s := status()).get("phase") in ("Succeeded", "Failed") and s,
               timeout=900)
    assert st["phase"] == "Succeeded", _story(devcluster, ns, "elastic")
    reshards = [r for r in st["recoveries"] if r["kind"] == "Reshard"]
    assert [r["layout"]["data"] for r in reshards] == [2, 3], history(st)
    assert reshards[0]["ranks"] == [1] and reshards[1]["ranks"] == []  # the grow answers no failure
    assert reshards[1]["tier"] in ("L0", "L1"), history(st)
    assert st["layout"]["data"] == 3 and st["replicas"] == 3 and st["step"] == steps
    reasons = [e["reason"] for e in _get(devcluster, "events", "-n", ns,
                                        "--field-selector", "involvedObject.name=elastic")["items"]]
    assert reasons.count("Reshard") == 2, reasons
    pods = _get(devcluster, "pods", "-n", ns, "-l", "lifeline.dev/job=elastic")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert sorted(p["metadata"]["labels"]["lifeline.dev/rank"] for p in live) == ["0", "1", "2"]
    assert next(p for p in live if p["metadata"]["labels"]["lifeline.dev/rank"] == "0")["metadata"]["uid"] == keeper
    # the arenas live in the pods' own volumes, not in the host's /dev/shm, where a deleted
    # pod's slots would stay behind (768 MiB for rank 2 here)
    # (`lifeline-<job>-<rank>`: a `lifeline run` of a job of that name elsewhere in the suite has its own)
    assert not [p for p in Path("/dev/shm").glob("lifeline-elastic-*") if re.fullmatch(r"lifeline-elastic-\d+", p.name)]


@pytest.mark.slow
def test_a_trainer_crash_in_one_stage_is_replayed_locally_from_its_sparse_window(devcluster, operator_release, tmp_path):
    """The operator takes the LocalizedReplay rung (the engine both runners share): with sparse
    checkpoints (W = 3) and no dense checkpoint before the end, a trainer killed in one pipeline
    stage makes that stage's ranks restore their latest complete window from their sidecars and
    replay it from the other stage's upstream logs while the other stage keeps its state; the job
    ends bit-identical to a failure-free run, and ``kubectl get tj`` shows the rung. (A node of
    the dev cluster holds ranks of both stages, so a node loss takes the global rung from the
    window instead: tests/launch/test_localized_replay.py covers node loss of one stage.)"""
    ns = operator_release
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = "gpt-moe-sparse"
    body["spec"]["steps"] = STEPS
    body["spec"]["checkpoint"]["every"] = body["spec"]["checkpoint"]["persist"]["every"] = STEPS
    body["spec"]["checkpoint"]["sparse"] = {"window": 3}
    body["spec"]["recovery"].pop("elastic")
    body["spec"]["recovery"]["localizedReplay"] = True
    body["spec"]["recovery"]["hangTimeoutSeconds"] = 120
    _forget_l2(devcluster, "gpt-moe-sparse")
    devcluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))

    def progressed():
        st = _get(devcluster, "trainingjob", "gpt-moe-sparse", "-n", ns).get("status") or {}
        return st if st.get("phase") == "Running" and (st.get("step") or 0) >= 8 else None

    _wait("training to pass step 8 (two sparse windows)", progressed, timeout=300)
    devcluster.kill_container("gpt-moe-sparse-1", "trainer", namespace=ns)

    def finished():
        st = _get(devcluster, "trainingjob", "gpt-moe-sparse", "-n", ns).get("status") or {}
        return st if st.get("phase") in ("Succeeded", "Failed") else None

    st = _wait("the job to finish", finished, timeout=900)
    history = [(r["kind"], r["ranks"], r.get("fromStep"), r.get("reason", "")[:200]) for r in st.get("recoveries", [])]
    assert st["phase"] == "Succeeded", f"{st.get('message')}; recoveries: {history}"
    first = st["recoveries"][0]
    assert first["kind"] == "LocalizedReplay" and "sparse window" in first["reason"], history
    assert first["ranks"] == [1] and "ranks [0, 1] restore" in first["reason"], history
    assert first["fromStep"] % 3 == 0
    row = devcluster.kubectl("get", "tj", "gpt-moe-sparse", "-n", ns, "--no-headers").split()
    assert st["recoveries"][-1]["kind"] in row
    got = _l2_digest(devcluster, "gpt-moe-sparse", STEPS)
    assert got == _reference_digest(body, tmp_path), "final parameters differ from the failure-free run's"
