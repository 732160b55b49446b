"""``StatefulState`` / ``StatefulTrainer``: the flat state of Stateful objects and its inverse (no processes)."""

from __future__ import annotations

import pickle
from collections import OrderedDict

import pytest
import torch
from torch import nn

from lifeline.errors import CheckpointError, ConfigError
from lifeline.runtime import StatefulState, StatefulTrainer


def _objects(seed: int) -> dict:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)
    return {"model": model, "optim": optim, "sched": sched}


def _step(objs: dict, i: int) -> float:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(i))
    loss = objs["model"](x).pow(2).mean()
    objs["optim"].zero_grad(set_to_none=True)
    loss.backward()
    objs["optim"].step()
    objs["sched"].step()
    return loss.item()


def _restore_into(template: dict, saved: dict) -> dict:
    """What a checkpointer's restore does: tensors filled in place, byte entries replaced."""
    out = dict(template)
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            out[key].copy_(value)
        else:
            out[key] = value
    return out


def test_a_restored_state_trains_on_bit_identically():
    a = _objects(0)
    for i in range(3):
        _step(a, i)
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in StatefulState(a).values(3).items()}
    assert {"model.0.weight", "optim.state.0.exp_avg", "optim.state.0.step", "optim.__rest__", "sched.__rest__",
            "rng.torch", "rng.python", "loop.step"} <= set(saved)
    b = _objects(1)  # other initial weights, an optimizer that never stepped
    state = StatefulState(b)
    assert state.load(_restore_into(state.template(0), saved)) == 3
    for i in range(3, 5):
        assert _step(a, i) == _step(b, i)
    for (name, pa), pb in zip(a["model"].named_parameters(), b["model"].parameters()):
        assert torch.equal(pa, pb), name
    assert a["sched"].get_last_lr() == b["sched"].get_last_lr()


def test_a_restart_from_scratch_loads_the_state_the_trainer_was_made_with():
    objs = _objects(0)
    before = [p.detach().clone() for p in objs["model"].parameters()]
    trainer = StatefulTrainer(objs, lambda i: _step(objs, i))
    for _ in range(2):
        trainer.train_step()
    assert trainer.step == 2 and objs["optim"].state
    trainer.load_state(trainer.initial_state())
    assert trainer.step == 0 and not objs["optim"].state
    assert all(torch.equal(p, q) for p, q in zip(objs["model"].parameters(), before))


def test_bad_names_objects_and_values_are_config_errors():
    model = nn.Linear(2, 2)
    for name in ("", "a.b", "rng", "loop"):
        with pytest.raises(ConfigError):
            StatefulState({name: model})
    with pytest.raises(ConfigError):
        StatefulState({"thing": object()})

    class Odd:
        def state_dict(self) -> dict:
            return {"when": object()}

        def load_state_dict(self, sd: dict) -> None: ...

    with pytest.raises(ConfigError) as err:
        StatefulState({"odd": Odd()}).values(0)
    assert err.value.key == "odd.when"


def test_a_byte_entry_naming_a_class_is_refused():
    model = nn.Linear(2, 2)
    values = StatefulState({"model": model}).values(0)
    values["model.__rest__"] = pickle.dumps(OrderedDict(weight="\x00tensor", bias="\x00tensor"))
    with pytest.raises(CheckpointError):
        StatefulState({"model": model}).load(values)
