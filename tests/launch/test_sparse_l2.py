"""Sparse windows in L2 and offline sparse-to-dense conversion (``lifeline ckpt densify``), end to end.

A real ``lifeline run`` (2 pipeline stages, real sidecars persisting to a directory, sparse windows
of 3 steps, every step also checkpointed densely and persisted) leaves both kinds of copy in L2. The
conversion of a window, run offline from L2 alone, must equal the dense checkpoint of the window's
last step bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lifeline.checkpoint import consolidate, list_steps, read_window_manifest, storage_from_uri, window_starts

from ._jobs import job_doc, lifeline_run, trainer_events, write_job

pytestmark = pytest.mark.slow  # `lifeline run` end to end: not in the fast local suite (docs/testing.md)

W = 3


def _doc(name: str, persist_every: int) -> dict:
    doc = job_doc(name, pipeline=2, data=1)
    doc["spec"]["checkpoint"].update(sparse={"window": W}, persist={"every": persist_every, "uri": "file:///unused"})
    doc["spec"]["recovery"].update(localizedReplay=True)
    doc["spec"]["recovery"].pop("elastic")
    return doc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse-l2")
    spec = write_job(root / "job.yaml", _doc("sparse-l2", 1))
    summary = lifeline_run(spec, root / "state", "--persist-uri", str(root / "l2"))
    assert summary["phase"] == "Succeeded" and summary["recoveries"] == []
    return root, spec, summary


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def _densify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lifeline", "ckpt", "densify", *args], capture_output=True, text=True,
                          timeout=300)


def test_every_rank_commits_its_last_two_windows_to_l2(run):
    root, _, _ = run
    storage, prefix = storage_from_uri(str(root / "l2"))
    for rank in (0, 1):  # 12 steps: windows 3, 6, 9 complete (window 0 has no slot 0); the two newest kept
        assert window_starts(storage, prefix, "sparse-l2", rank) == [6, 9]
        manifest = read_window_manifest(storage, prefix, "sparse-l2", rank, 9)
        active = [op for s in manifest.slots for op in s.record.active]
        assert len(active) == len(set(active)) and manifest.slots[-1].record.frozen == ()


def test_a_window_densified_offline_equals_the_dense_checkpoint_of_its_last_step(run, tmp_path):
    root, spec, _ = run
    out = tmp_path / "dense"
    out.mkdir()
    proc = _densify(str(root / "l2"), "--spec", str(spec), "--window", "6", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["window_start"], result["step"], result["world_size"]) == (6, 8, 2) and result["bytes_read"] > 0
    storage, prefix = storage_from_uri(str(root / "l2"))
    converted, cprefix = storage_from_uri(str(out))
    assert list_steps(converted, cprefix, "sparse-l2") == [8]
    _same(consolidate(converted, cprefix, "sparse-l2", 8), consolidate(storage, prefix, "sparse-l2", 8))
    # the default window is the latest every rank committed; a step already stored is never overwritten
    proc = _densify(str(root / "l2"), "--spec", str(spec), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 11
    _same(consolidate(converted, cprefix, "sparse-l2", 11), consolidate(storage, prefix, "sparse-l2", 11))
    proc = _densify(str(root / "l2"), "--spec", str(spec))
    assert proc.returncode == 2 and "already has a checkpoint of step 11" in proc.stderr


def test_losing_every_node_restores_the_window_from_l2_and_ends_bit_identical(tmp_path):
    """Both nodes lost at step 7: no memory copy survives and no dense copy was persisted yet
    (persist every 10), so every rank restores its latest window from L2 and re-runs it. The
    reference is the same spec without failures (the summary's digest is computed from the same
    source, the final step's checksums, in both)."""
    reference = lifeline_run(write_job(tmp_path / "ref.yaml", _doc("sparse-l2-ref", 10)), tmp_path / "ref",
                             "--persist-uri", str(tmp_path / "ref-l2"))
    assert reference["recoveries"] == []
    spec = write_job(tmp_path / "job.yaml", _doc("sparse-l2-lost", 10))
    summary = lifeline_run(spec, tmp_path / "state", "--persist-uri", str(tmp_path / "l2"),
                           "--inject-failure", "node:rank=0:step=7", "--inject-failure", "node:rank=1:step=7")
    assert summary["phase"] == "Succeeded"
    first = summary["recoveries"][0]
    assert (first["action"], first["tier"]) == ("Rollback", "L2")
    # the latest window every rank committed: 3..5 (both ranks hold at step 7 until the kills land,
    # so window 6..8 never completes)
    assert (first["restore_step"], first["from_step"]) == (3, 7), first
    events = trainer_events(tmp_path / "state")
    restores = [e for e in events if e.get("event") == "restore" and e["generation"] == 1]
    assert {(e["rank"], e.get("source")) for e in restores} == {(0, "window"), (1, "window")}
    # one fault (both nodes at once), one recovery: a second one would be a defect of the first
    assert len(summary["recoveries"]) == 1, summary["recoveries"]
    assert summary["digest"] == reference["digest"], _divergence(tmp_path, events)


def _equal(a, b) -> bool:
    """Bit for bit (``torch.equal`` takes -0.0 for 0.0)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)))
    return a == b


def _divergence(tmp_path, events: list[dict]) -> str:
    """What a failing digest comparison needs to be diagnosed: the recovery's verification events,
    each rank's losses next to the reference's, and the entries of the step-10 L2 copies that differ
    (the first step both runs persisted)."""
    ref_events = trainer_events(tmp_path / "ref")
    losses = {}
    for name, evs in (("ref", ref_events), ("run", events)):
        for e in evs:
            if e.get("event") == "step" and e.get("loss") is not None:
                losses.setdefault(e["step"], {})[f"{name}/g{e['generation']}"] = e["loss"]
    checks = [{k: e.get(k) for k in ("event", "rank", "generation", "step", "restored", "entries")}
              for e in events if e.get("event") in ("verified", "verify_failed", "restore", "failure")]
    try:
        ref_l2, ref_prefix = storage_from_uri(str(tmp_path / "ref-l2"))
        run_l2, run_prefix = storage_from_uri(str(tmp_path / "l2"))
        a = consolidate(ref_l2, ref_prefix, "sparse-l2-ref", 10)
        b = consolidate(run_l2, run_prefix, "sparse-l2-lost", 10)
        differ = sorted(k for k in a.keys() | b.keys() if not _equal(a.get(k), b.get(k)))
    except Exception as err:  # noqa: BLE001 - a diagnostic only
        differ = [f"(step 10 not compared: {err})"]
    return (f"final parameters differ from the failure-free run; step-10 L2 entries that differ: {differ[:12]} "
            f"({len(differ)}); checks: {checks}; losses by step: {losses}")
