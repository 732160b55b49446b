"""GPT-MoE across real processes: torch.distributed with gloo on 127.0.0.1 (pipeline × data)."""

from __future__ import annotations

import pytest
import torch

from ._runs import merged, run_ranks

pytestmark = pytest.mark.slow  # multi-process torch runs: not in the fast local suite (docs/testing.md)

STEPS = 24


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
