"""ZeRO-1 in the GPT-MoE trainer across real processes (gloo on 127.0.0.1).

``zero1=True`` keeps each data-parallel rank's partition of the AdamW moments only; the run is bit
for bit the ``zero1=False`` run (AdamW is elementwise; the gradient reduction is unchanged), its
checkpoint consolidates to the same logical tensors, and it reloads in other data degrees (with and
without ZeRO-1) through the universal format.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lifeline.checkpoint import Layout, MemoryStorage, Zero1, consolidate, load, save_states
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoESpec, pattern_rules

from ._runs import run_ranks

pytestmark = pytest.mark.slow  # multi-process torch runs: not in the fast local suite (docs/testing.md)

STEPS = 4
MODEL = {"d_model": 32, "n_heads": 4, "d_expert": 32, "seq_len": 32, "micro_batch": 2, "corpus_bytes": 1 << 16}
CFG = GPTMoEConfig.from_mapping(MODEL)
ZCFG = dataclasses.replace(CFG, zero1=True)


def run(tmp, name: str, zero1: bool, data: int, expert: int = 1) -> list[dict]:
    return run_ranks(tmp, name, 1, data, STEPS, expert=expert, model={**MODEL, "zero1": zero1})


def states(results: list[dict]) -> list[dict]:
    return [{**info["state"], **info["bytes"]} for info in results]


def consolidated(results_or_states: list[dict], layout: Layout, cfg: GPTMoEConfig, step: int = STEPS,
                 storage: MemoryStorage | None = None) -> dict[str, torch.Tensor]:
    storage = storage or MemoryStorage()
    items = results_or_states if "state" not in results_or_states[0] else states(results_or_states)
    save_states(storage, "ck", "z", step, layout, pattern_rules(cfg), items)
    return consolidate(storage, "ck", "z", step)


@pytest.fixture(scope="module", params=[(2, 1), (2, 2)], ids=["D2", "D2xE2"])
def pair(request, tmp_path_factory):
    data, expert = request.param
    tmp = tmp_path_factory.mktemp("z")
    layout = Layout(data=data, expert=expert)
    return layout, run(tmp, "adam", False, data, expert), run(tmp, "zero1", True, data, expert)


def test_zero1_is_bit_identical_and_keeps_one_partition_of_the_moments(pair):
    layout, plain, zero = pair
    for r, (a, b) in enumerate(zip(plain, zero, strict=True)):
        assert a["losses"] == b["losses"]
        assert a["state"].keys() == b["state"].keys()
        data = layout.coords(r).data
        for k, full in a["state"].items():
            if k.startswith(("optim.exp_avg.", "optim.exp_avg_sq.")):
                start, stop = Zero1.partition(full.numel(), layout, layout.coords(r))
                assert b["state"][k].shape == (stop - start,), k  # only its partition is kept
                assert torch.equal(full.reshape(-1)[start:stop], b["state"][k]), (r, data, k)
            else:
                assert torch.equal(full, b["state"][k]), (r, k)  # parameters, steps: every bit
    kept = sum(v.numel() for k, v in zero[0]["state"].items() if k.startswith("optim.exp_avg"))
    whole = sum(v.numel() for k, v in plain[0]["state"].items() if k.startswith("optim.exp_avg"))
    assert kept <= whole // layout.data + 2 * len(zero[0]["state"])


def test_zero1_checkpoint_consolidates_to_the_plain_one(pair):
    layout, plain, zero = pair
    a, b = consolidated(plain, layout, CFG), consolidated(zero, layout, ZCFG)
    assert a.keys() == b.keys() and any(k.startswith("optim.exp_avg_sq.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _reload(storage: MemoryStorage, step: int, target: Layout, cfg: GPTMoEConfig) -> list[dict]:
    """Fresh trainers of ``target`` (configured with ``cfg``) load checkpoint ``step``; their states."""
    out = []
    for r in range(target.world_size):
        trainer = GPTMoESpec(cfg).build(target, r)
        into = trainer.state()
        load(storage, "ck", "z", step, target, r, pattern_rules(cfg), into)
        trainer.load_state(into)
        out.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.state().items()})
    return out


def test_zero1_checkpoint_reloads_in_other_data_degrees(pair):
    layout, _, zero = pair
    storage = MemoryStorage()
    full = consolidated(zero, layout, ZCFG, step=1, storage=storage)
    for step, (target, cfg) in enumerate([(Layout(), CFG), (Layout(data=4), ZCFG), (Layout(data=3), ZCFG)], 2):
        reloaded = _reload(storage, 1, target, cfg)
        if cfg.zero1 and target.data > 1:  # partitions of a different size than the saved ones
            key = next(k for k in reloaded[1] if k.startswith("optim.exp_avg."))
            assert reloaded[1][key].numel() < full[key].numel()
        again = consolidated(reloaded, target, cfg, step=step, storage=storage)
        assert again.keys() == full.keys()
        for k in full:
            assert torch.equal(full[k], again[k]), (target.to_dict(), k)


def test_zero1_rules_store_the_moments_as_partitions_of_their_parameter():
    rules = pattern_rules(ZCFG)
    assert rules.match("optim.exp_avg.layers.0.attn.qkv.weight") == Zero1("layers.0.attn.qkv.weight")
    assert rules.match("optim.exp_avg_sq.embed.weight") == Zero1("embed.weight")
    assert rules.match("layers.0.attn.qkv.weight") == pattern_rules(CFG).match("layers.0.attn.qkv.weight")
    assert rules.match("optim.step.embed.weight") == pattern_rules(CFG).match("optim.step.embed.weight")


def test_zero1_in_one_process_is_the_plain_optimizer_and_unconnected_data_ranks_are_named():
    from lifeline.errors import ConfigError

    plain, zero = GPTMoESpec(CFG).build(Layout(), 0), GPTMoESpec(ZCFG).build(Layout(), 0)
    assert [plain.train_step().loss for _ in range(2)] == [zero.train_step().loss for _ in range(2)]
    for (k, a), b in zip(plain.model.named_parameters(), zero.model.parameters()):
        assert torch.equal(a, b), k
    unconnected = GPTMoESpec(ZCFG).build(Layout(data=2), 0)  # never connect()ed: no data group
    with pytest.raises(ConfigError) as err:
        unconnected.train_step()
    assert err.value.field == "zero1" and "connect()" in err.value.message
