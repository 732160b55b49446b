"""GPT-MoE across real processes: torch.distributed with gloo on 127.0.0.1 (pipeline × data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("_worker.py")
STEPS = 24


def run_ranks(tmp: Path, name: str, pipeline: int, data: int, steps: int = STEPS, *, tensor: int = 1,
              expert: int = 1, model: dict | None = None) -> list[dict]:
    """Run every rank as a subprocess; returns per rank {"losses", "step", "state" (its tensors),
    "bytes" (its byte entries: data position, RNG)}."""
    out = tmp / name
    out.mkdir()
    world = tensor * pipeline * data * expert
    cfg = json.dumps({"tensor": tensor, "pipeline": pipeline, "data": data, "expert": expert, "steps": steps,
                      "store": str(out / "store"), "model": model or {}})
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(out), cfg], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(world)]
    try:
        outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{outputs[r][-3000:]}"
    results = []
    for r in range(world):
        info = json.loads((out / f"rank-{r}.json").read_text())
        saved = torch.load(out / f"rank-{r}.pt")
        info["state"] = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
        info["bytes"] = {k: v for k, v in saved.items() if not isinstance(v, torch.Tensor)}
        results.append(info)
    return results


def merged(results: list[dict]) -> dict[str, torch.Tensor]:
    """Every stage's state of data-parallel replica 0, merged (names are global)."""
    out: dict[str, torch.Tensor] = {}
    for info in results:
        for k, v in info["state"].items():
            out.setdefault(k, v)
    return out


@pytest.fixture(scope="module")
def pp2_dp2_runs(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("pp2dp2")
    return run_ranks(tmp, "a", 2, 2), run_ranks(tmp, "b", 2, 2)


def test_pp2_dp2_trains_and_the_loss_falls(pp2_dp2_runs):
    results, _ = pp2_dp2_runs
    # ranks: ((pipeline * D) + data); last stage = ranks 2, 3 hold the loss, identical across replicas
    losses = results[2]["losses"]
    assert results[3]["losses"] == losses, "the reported loss is the data-parallel mean"
    assert all(x is None for x in results[0]["losses"] + results[1]["losses"])
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 1.0, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert all(info["step"] == STEPS for info in results)


def test_data_parallel_replicas_hold_identical_parameters(pp2_dp2_runs):
    results, _ = pp2_dp2_runs
    for stage_ranks in ((0, 1), (2, 3)):
        a, b = (results[r]["state"] for r in stage_ranks)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_two_identical_runs_are_bit_identical(pp2_dp2_runs):
    run_a, run_b = pp2_dp2_runs
    for ra, rb in zip(run_a, run_b):
        assert ra["losses"] == rb["losses"]
        assert ra["state"].keys() == rb["state"].keys()
        for k in ra["state"]:
            assert torch.equal(ra["state"][k], rb["state"][k]), k


def test_pipeline_two_stages_matches_one(tmp_path):
    steps = 8
    one = run_ranks(tmp_path, "pp1", 1, 1, steps)
    two = run_ranks(tmp_path, "pp2", 2, 1, steps)
    assert two[1]["losses"] == pytest.approx(one[0]["losses"], rel=1e-5, abs=1e-6)
    full, split = one[0]["state"], merged(two)
    assert full.keys() == split.keys()
    for k in full:
        torch.testing.assert_close(split[k], full[k], rtol=1e-5, atol=1e-7, msg=k)
