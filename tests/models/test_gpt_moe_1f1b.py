"""The 1F1B pipeline schedule (PipeDream-Flush) across real processes (gloo on 127.0.0.1).

Layouts are written (tensor, pipeline, data, expert); every run has more micro-batches than stages,
clipping on (``grad_clip`` 0.5) and the learning-rate warm-up. Both schedules accumulate gradients
in micro-batch order, so a 1F1B run equals the GPipe run of the same configuration bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from lifeline.checkpoint import Layout
from lifeline.errors import RecoveryError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec

from ._runs import run_ranks
from ._worker import DictLog

pytestmark = pytest.mark.slow  # multi-process torch runs: not in the fast local suite (docs/testing.md)

STEPS = 3
MICRO = 5
P3 = {"corpus_bytes": 1 << 18, "n_layers": 3, "micro_batches": MICRO, "grad_clip": 0.5, "warmup_steps": 2}
SMALL = {"corpus_bytes": 1 << 18, "micro_batches": 3, "grad_clip": 0.5, "warmup_steps": 2, "d_model": 32,
         "d_expert": 32, "seq_len": 32, "micro_batch": 2}


def assert_bit_identical(run_a: list[dict], run_b: list[dict]) -> None:
    for ra, rb in zip(run_a, run_b, strict=True):
        assert ra["losses"] == rb["losses"]
        assert ra["state"].keys() == rb["state"].keys()
        for k in ra["state"]:
            assert torch.equal(ra["state"][k], rb["state"][k]), k


@pytest.fixture(scope="module")
def p3(tmp_path_factory) -> tuple[list[dict], list[dict], list[dict]]:
    """Three stages, five micro-batches: 1F1B twice (the first with its upstream logs captured
    around the last step and saved activations measured), GPipe once (likewise)."""
    tmp = tmp_path_factory.mktemp("p3")
    a = run_ranks(tmp, "a", 3, 1, STEPS, model={**P3, "schedule": "1f1b"}, capture=STEPS - 1, probe=True)
    b = run_ranks(tmp, "b", 3, 1, STEPS, model={**P3, "schedule": "1f1b"})
    g = run_ranks(tmp, "g", 3, 1, STEPS, model={**P3, "schedule": "gpipe"}, capture=STEPS - 1, probe=True)
    return a, b, g


def test_1f1b_repeats_bit_identically(p3):
    a, b, _ = p3
    assert a[2]["losses"][0] > a[2]["losses"][-1] > 0
    assert_bit_identical(a, b)


def test_1f1b_equals_gpipe_bit_for_bit_and_logs_the_same_entries(p3):
    a, _, g = p3
    assert_bit_identical(a, g)
    assert [info["experts"] for info in a] == [info["experts"] for info in g]  # sparse checkpoints' order
    for ra, rg in zip(a, g):  # keyed by (iteration, micro-batch, direction), whatever the order sent
        assert ra["log"].keys() == rg["log"].keys() and ra["log"]
        for key in ra["log"]:
            assert torch.equal(ra["log"][key], rg["log"][key]), key


def test_1f1b_holds_at_most_stages_minus_stage_micro_batches(p3):
    a, _, g = p3
    assert [info["in_flight"] for info in a] == [[3] * STEPS, [2] * STEPS, [1] * STEPS]
    assert [info["in_flight"] for info in g] == [[MICRO] * STEPS] * 3
    for stage, (ra, rg) in enumerate(zip(a, g)):
        held, gpipe = max(ra["saved_bytes"]), max(rg["saved_bytes"])
        share = (3 - stage) / MICRO  # the saved activations shrink with the micro-batches held
        assert held <= 1.02 * share * gpipe, (stage, held, gpipe)
        assert held >= 0.98 * share * gpipe, (stage, held, gpipe)


class LogSource:
    """A ``ReplaySource`` over the upstream logs the live run's ranks captured."""

    def __init__(self, logs: dict[int, dict]) -> None:
        self.logs = logs

    def fetch(self, out, *, iteration, micro_batch, stage, direction, rank) -> None:
        out.copy_(self.logs[rank][(iteration, micro_batch, direction)])


def _replayer(stage: int, before: dict):
    trainer = GPTMoESpec(GPTMoEConfig.from_mapping({**P3, "schedule": "1f1b"})).build(Layout(pipeline=3), stage)
    trainer.load_state(before)
    trainer.log = DictLog()
    return trainer


def test_replaying_each_stage_reproduces_the_live_1f1b_step_bit_for_bit(p3):
    """``replay_step`` from the neighbours' logs (inputs, output gradients, the gathered sums of
    squares; its own norm check passes only when its gradients match bit for bit) ends at the live
    step's state and logs again exactly what the live stage sent."""
    a, _, _ = p3
    logs = {r: info["log"] for r, info in enumerate(a)}
    for stage in range(3):
        trainer = _replayer(stage, a[stage]["before"])
        assert trainer.step == STEPS - 1
        result = trainer.replay_step(LogSource(logs))
        assert result.step == STEPS and trainer.activations_in_flight == 3 - stage
        if stage == 2:
            assert result.loss == a[2]["losses"][-1]
        state = trainer.state()
        for k, v in a[stage]["state"].items():
            assert torch.equal(state[k], v), (stage, k)
        live = {k: v for k, v in a[stage]["log"].items() if k[0] == STEPS - 1}
        assert trainer.log.entries.keys() == live.keys()
        for key, tensor in live.items():
            assert torch.equal(trainer.log.entries[key], tensor), (stage, key)


def test_a_replay_fed_a_wrong_log_entry_is_refused(p3):
    a, _, _ = p3
    logs = {r: dict(info["log"]) for r, info in enumerate(a)}
    key = (STEPS - 1, MICRO - 1, "bwd")  # the last gradient stage 2 sent back to stage 1
    logs[2][key] = logs[2][key] * (1 + 2 ** -20)
    with pytest.raises(RecoveryError, match="diverged"):
        _replayer(1, a[1]["before"]).replay_step(LogSource(logs))


def test_1f1b_with_tensor_and_expert_parallel_equals_gpipe(tmp_path):
    """(2, 2, 1, 2): tensor collectives and the experts' all-to-all run inside each stage between
    the pipeline's point-to-point exchanges; 8 ranks."""
    one = run_ranks(tmp_path, "1f1b", 2, 1, 2, tensor=2, expert=2, model={**SMALL, "schedule": "1f1b"})
    gpipe = run_ranks(tmp_path, "gpipe", 2, 1, 2, tensor=2, expert=2, model=SMALL)
    assert [info["in_flight"] for info in one] == [[2, 2]] * 4 + [[1, 1]] * 4
    assert_bit_identical(one, gpipe)


def test_1f1b_with_zero1_data_parallel_equals_plain_gpipe(tmp_path):
    """(1, 2, 2, 1) with ZeRO-1 under 1F1B vs plain AdamW under GPipe: the same bits."""
    one = run_ranks(tmp_path, "1f1b", 2, 2, 2, model={**SMALL, "schedule": "1f1b", "zero1": True})
    gpipe = run_ranks(tmp_path, "gpipe", 2, 2, 2, model=SMALL)
    assert [info["in_flight"] for info in one] == [[2, 2]] * 2 + [[1, 1]] * 2
    for ro, rg in zip(one, gpipe, strict=True):
        assert ro["losses"] == rg["losses"]
        for k, v in rg["state"].items():
            if not k.startswith("optim.exp_avg"):  # zero1 holds its piece of the moments
                assert torch.equal(ro["state"][k], v), k
