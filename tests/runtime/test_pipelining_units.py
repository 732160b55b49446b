"""Fast checks of the pipelining adapter's parts that need no process group: the sparse-checkpoint
operator registry (``lifeline.runtime.Operators``) over the example's stages, and the determinism
check at start. The multi-rank logging and replay tests are in test_pipelining.py (slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lifeline.errors import ConfigError
from lifeline.runtime import Operators, StatefulState
from lifeline.runtime._pipeline_trainer import check_deterministic


def _example():
    path = Path(__file__).resolve().parents[2] / "examples" / "pipelining-moe" / "train.py"
    spec = importlib.util.spec_from_file_location("pipelining_moe_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_operators_group_parameters_by_module_and_cover_the_state():
    ex = _example()
    module = ex.build_stage(2, 0)
    optim = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.zeros(2, 16, 32)).sum().backward()
    optim.step()
    state = StatefulState({"model": module, "optim": optim}).values(1)
    ops, members = Operators({"model": module, "optim": optim}).operators(state)
    assert {o.kind for o in ops} == {"dense"}
    assert members["model.block.moe.experts.1.0"].weights == ("model.block.moe.experts.1.0.weight",
                                                               "model.block.moe.experts.1.0.bias")
    _covers_every_tensor_once(state, members)


def test_naming_experts_and_routers_in_one_call_makes_moe_operators_with_their_counts():
    ex = _example()
    module = ex.build_stage(1, 0)
    optim = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.zeros(2, 16, 32)).sum().backward()
    optim.step()
    state = StatefulState({"model": module, "optim": optim}).values(1)
    registry = Operators({"model": module, "optim": optim}).moe(
        experts=ex.EXPERTS_OF, routers=ex.ROUTER_OF, layer=1,
        counts=lambda: {(1, e): n for e, n in enumerate(module.block.moe.take_counts())})
    ops, members = registry.operators(state, registry.activations())
    kinds = {o.name: o.kind for o in ops}
    assert kinds == {**{f"layers.1.experts.{e}": "expert" for e in range(4)}, "layers.1.router": "router",
                     "dense": "dense"}
    assert sum(o.activations for o in ops) == 2 * 16, "every token of the forward is routed once"
    assert len(members["layers.1.experts.0"].optimizer) == 3 * 4, "exp_avg, exp_avg_sq, step of 4 tensors"
    _covers_every_tensor_once(state, members)
    with pytest.raises(ConfigError, match="expert"):
        Operators({"model": module}).moe(experts=r"block\.moe\.experts\.")


def _covers_every_tensor_once(state: dict, members: dict) -> None:
    owned = [n for m in members.values() for n in (*m.weights, *m.optimizer)]
    assert len(owned) == len(set(owned)), "an entry belongs to two operators"
    assert set(owned) == {k for k, v in state.items() if isinstance(v, torch.Tensor)}


def test_a_model_that_cannot_replay_bit_for_bit_is_refused_at_start():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        with pytest.raises(ConfigError, match="use_deterministic_algorithms"):
            check_deterministic({"model": module}, rng=True)
        torch.use_deterministic_algorithms(True)
        check_deterministic({"model": module}, rng=True)
        with pytest.raises(ConfigError, match="dropout"):
            check_deterministic({"model": module}, rng=False)
    finally:
        torch.use_deterministic_algorithms(before)
