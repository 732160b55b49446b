"""GPT-MoE tensor- and expert-parallel across real processes (gloo on 127.0.0.1).

Layouts are written (tensor, pipeline, data, expert). Runs in different layouts start from the
same full parameters and read the same global batches when ``data * expert`` is equal, so their
consolidated parameters agree closely (not bit for bit: the reductions differ); a run and its
repeat in the same layout agree bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from lifeline.checkpoint import Expert, Layout, MemoryStorage, Replicated, consolidate, load, save_states
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules

from ._runs import run_ranks

pytestmark = pytest.mark.slow  # multi-process torch runs: not in the fast local suite (docs/testing.md)

STEPS = 6
MODEL = {"corpus_bytes": 1 << 18}
CFG = GPTMoEConfig.from_mapping(MODEL)
TOL = {"rtol": 1e-4, "atol": 1e-6}


def run(tmp, name: str, tensor: int = 1, pipeline: int = 1, data: int = 1, expert: int = 1) -> list[dict]:
    return run_ranks(tmp, name, pipeline, data, STEPS, tensor=tensor, expert=expert, model=MODEL)


def full_states(results: list[dict]) -> list[dict]:
    return [{**info["state"], **info["bytes"]} for info in results]


def consolidated(results: list[dict], layout: Layout) -> dict[str, torch.Tensor]:
    """Every rank's state saved in ``layout`` through the universal format, consolidated."""
    storage = MemoryStorage()
    save_states(storage, "ck", "run", STEPS, layout, pattern_rules(CFG), full_states(results))
    return consolidate(storage, "ck", "run", STEPS)


def assert_bit_identical(run_a: list[dict], run_b: list[dict]) -> None:
    for ra, rb in zip(run_a, run_b, strict=True):
        assert ra["losses"] == rb["losses"]
        assert ra["state"].keys() == rb["state"].keys()
        for k in ra["state"]:
            assert torch.equal(ra["state"][k], rb["state"][k]), k


def assert_close_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if not k.startswith("optim."):
            torch.testing.assert_close(a[k], b[k], **TOL, msg=k)


def replicated(results: list[dict], layout: Layout, key) -> int:
    """Ranks that agree on ``key(coords)`` hold bit-identical copies of every tensor they share
    that is not split across tensor ranks (``Replicated`` or ``Expert``); returns how many pairs."""
    rules, by, pairs = pattern_rules(CFG), {}, 0
    for r, info in enumerate(results):
        by.setdefault(key(layout.coords(r)), []).append(info["state"])
    for states in by.values():
        for other in states[1:]:
            for k in sorted(states[0].keys() & other.keys()):
                if isinstance(rules.match(k), (Replicated, Expert)):
                    assert torch.equal(states[0][k], other[k]), k
                    pairs += 1
    return pairs


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """One rank, and two data-parallel replica groups (the global batch of data * expert = 2)."""
    tmp = tmp_path_factory.mktemp("ref")
    return run(tmp, "one"), run(tmp, "d2", data=2)


@pytest.fixture(scope="module")
def tensor2(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("t2")
    return run(tmp, "a", tensor=2), run(tmp, "b", tensor=2)


@pytest.fixture(scope="module")
def expert2(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("e2")
    return run(tmp, "a", expert=2), run(tmp, "b", expert=2)


@pytest.fixture(scope="module")
def four_d(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("x8")
    return run(tmp, "a", tensor=2, pipeline=2, expert=2), run(tmp, "b", tensor=2, pipeline=2, expert=2)


def test_tensor_parallel_matches_one_rank(reference, tensor2):
    one, _ = reference
    t2, _ = tensor2
    assert t2[0]["losses"] == t2[1]["losses"], "every tensor rank computes the same loss"
    assert t2[0]["losses"] == pytest.approx(one[0]["losses"], rel=1e-5)
    layout = Layout(tensor=2)
    assert t2[0]["state"]["layers.0.attn.qkv.weight"].shape == (3 * CFG.d_model // 2, CFG.d_model)
    assert t2[1]["state"]["lm_head.weight"].shape == (CFG.padded_vocab // 2, CFG.d_model)
    assert replicated(t2, layout, lambda c: None) > 0  # router, norms, experts: the same bits on both
    assert_close_params(consolidated(t2, layout), consolidated(one, Layout()))


def test_tensor_parallel_repeats_bit_identically(tensor2):
    assert_bit_identical(*tensor2)


def test_expert_parallel_matches_data_parallel(reference, expert2):
    _, d2 = reference
    e2, _ = expert2
    assert e2[0]["losses"] == e2[1]["losses"], "the loss is the mean over both expert ranks' tokens"
    assert e2[0]["losses"] == pytest.approx(d2[0]["losses"], rel=1e-5)
    experts = [{k.split(".")[4] for k in info["state"] if ".experts." in k and not k.startswith("optim.")}
               for info in e2]
    assert experts == [{"0", "1"}, {"2", "3"}], "contiguous blocks of experts per expert rank"
    assert replicated(e2, Layout(expert=2), lambda c: None) > 0  # router, norms: the same bits
    assert_close_params(consolidated(e2, Layout(expert=2)), consolidated(d2, Layout(data=2)))


def test_expert_parallel_repeats_bit_identically(expert2):
    assert_bit_identical(*expert2)


def test_expert_and_data_parallel_together_match_data_parallel(tmp_path):
    # D=2 x E=2: expert gradients summed over the data replicas of the same experts (expert_data
    # group), the rest over all four replica groups (dense group); D=4 reads the same global batch
    de = run(tmp_path, "d2e2", data=2, expert=2)
    d4 = run(tmp_path, "d4", data=4)
    assert all(info["losses"] == de[0]["losses"] for info in de)
    assert de[0]["losses"] == pytest.approx(d4[0]["losses"], rel=1e-5)
    layout = Layout(data=2, expert=2)
    assert replicated(de, layout, lambda c: c.expert) > 0  # data replicas hold the same experts
    assert_close_params(consolidated(de, layout), consolidated(d4, Layout(data=4)))


def test_four_dimensional_layout_trains_and_repeats_bit_identically(reference, four_d):
    a, b = four_d
    layout = Layout(tensor=2, pipeline=2, expert=2)
    last = [info["losses"] for r, info in enumerate(a) if layout.coords(r).pipeline == 1]
    assert all(losses == last[0] for losses in last)
    assert last[0][-1] < last[0][0] - 0.3, f"loss did not fall: {last[0]}"
    assert_bit_identical(a, b)
    assert replicated(a, layout, lambda c: (c.pipeline, c.expert)) > 0  # tensor ranks agree on what they share
    _, d2 = reference
    assert_close_params(consolidated(a, layout), consolidated(d2, Layout(data=2)))


def _reshard(states: list[dict], source: Layout, target: Layout, step: int, storage: MemoryStorage) -> list[dict]:
    """Load the checkpoint saved from ``states`` in ``source`` into fresh trainers of ``target``
    (through :func:`lifeline.checkpoint.load` and ``load_state``); returns their states."""
    rules = pattern_rules(CFG)
    save_states(storage, "ck", "re", step, source, rules, states)
    out = []
    for r in range(target.world_size):
        trainer = GPTMoESpec(CFG).build(target, r)
        into = trainer.state()
        load(storage, "ck", "re", step, target, r, rules, into)
        trainer.load_state(into)
        out.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.state().items()})
    return out


def test_checkpoint_reshards_between_four_dimensional_layouts(four_d):
    a, _ = four_d
    layout = Layout(tensor=2, pipeline=2, expert=2)
    storage = MemoryStorage()
    states = full_states(a)
    one = _reshard(states, layout, Layout(), 1, storage)
    wide = _reshard(states, layout, Layout(tensor=4, expert=4), 2, storage)
    back = _reshard(one, Layout(), layout, 3, storage)
    save_states(storage, "ck", "re", 4, Layout(), pattern_rules(CFG), one)
    save_states(storage, "ck", "re", 5, Layout(tensor=4, expert=4), pattern_rules(CFG), wide)
    full = consolidate(storage, "ck", "re", 1)
    for step in (4, 5):
        other = consolidate(storage, "ck", "re", step)
        assert full.keys() == other.keys()
        for k in full:
            assert torch.equal(full[k], other[k]), (step, k)
    for original, restored in zip(states, back, strict=True):  # T=2,E=2 -> T=1,E=1 -> T=2,E=2: every shard
        tensors = [k for k, v in original.items() if isinstance(v, torch.Tensor)]  # bytes are per rank
        assert sorted(tensors) == sorted(k for k, v in restored.items() if isinstance(v, torch.Tensor))
        for k in tensors:
            assert torch.equal(original[k], restored[k]), k
