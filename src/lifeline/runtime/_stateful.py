"""The universal-format state of a dict of ``Stateful`` objects (model, optimizer, LR scheduler, ...).

:class:`StatefulState` turns ``{"model": model, "optim": optim, ...}`` — what
``torch.distributed.checkpoint`` would take — into the flat state a
:class:`~lifeline.runtime.Checkpointer` saves, and back:

* every tensor of ``obj.state_dict()`` (nested dicts and lists walked) is the entry
  ``<name>.<path>`` (``model.fc1.weight``, ``optim.state.0.exp_avg``), a CPU tensor laid out by the
  pattern rules (``PatternRules()``: replicated, right for data parallelism);
* the rest of each state dict (hyper-parameters, ``param_groups``, scalars) is the byte entry
  ``<name>.__rest__``: a pickle of plain containers and scalars only, read back by an unpickler that
  refuses every class;
* ``rng.torch`` / ``rng.python`` (the process's torch CPU and ``random`` generators) and ``loop.step``
  (the number of completed optimizer steps, JSON) are byte entries too.

One format, the one ``lifeline.checkpoint`` writes for the reference model: no second format.
"""

from __future__ import annotations

import io
import json
import pickle
import random
from collections.abc import Mapping
from typing import Union

import torch
from torch import Tensor
from torch.distributed.checkpoint.stateful import Stateful

from lifeline.errors import CheckpointError, ConfigError

__all__ = ["Stateful", "StatefulState", "StateValues", "STEP_KEY"]

StateValues = Mapping[str, Union[Tensor, bytes]]
"""A flat checkpoint state: fully qualified name → CPU tensor or byte entry."""

STEP_KEY = "loop.step"
_RESERVED = ("rng", "loop")
_TENSOR = "\x00tensor"  # where a tensor stood in a state dict's skeleton
_PLAIN = (str, int, float, bool, bytes, type(None))
Node = Union[dict, list, tuple, str, int, float, bool, bytes, None, Tensor]


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain containers and scalars only: a pickle naming any class or function is refused."""

    def find_class(self, module: str, name: str) -> type:
        raise CheckpointError(f"a checkpoint's state entry names {module}.{name}: only plain containers and "
                              "scalars are read back")


def _dumps(value: object) -> bytes:
    return pickle.dumps(value, protocol=4)


def _loads(data: bytes, key: str) -> object:
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise CheckpointError(f"state entry {key!r} is not a plain pickle: {err}", key=key) from None


class StatefulState:
    """The flat checkpoint state of ``states`` (see the module docstring) and its inverse.

    Args:
        states: ``{name: obj}``, each ``obj`` with ``state_dict()`` / ``load_state_dict(sd)`` (a module —
            the unwrapped one, not its ``DistributedDataParallel`` — an optimizer, an LR scheduler, ...).
            Names are non-empty, without dots, and not ``rng`` or ``loop``.
        rng: also save and restore the torch CPU and Python ``random`` generators of this process.

    Raises:
        ConfigError: a bad name, or an object without ``state_dict``/``load_state_dict``.
    """

    def __init__(self, states: Mapping[str, Stateful], *, rng: bool = True) -> None:
        for name, obj in states.items():
            if not name or "." in name or name in _RESERVED:
                raise ConfigError(f"state name {name!r}: use a non-empty name without dots, not one of {_RESERVED}",
                                  field="states", key=name)
            if not isinstance(obj, Stateful):
                raise ConfigError(f"state {name!r} ({type(obj).__name__}) has no state_dict()/load_state_dict()",
                                  field="states", key=name)
        self.states = dict(states)
        self.rng = rng

    def values(self, step: int) -> dict[str, Tensor | bytes]:
        """The flat state after ``step`` completed optimizer steps. Model tensors are the live ones
        (a restore fills them in place); tensors off the CPU are copied to it.

        Raises:
            ConfigError: a state dict holds a value that is neither a tensor nor a plain container/scalar.
        """
        out: dict[str, Tensor | bytes] = {STEP_KEY: json.dumps({"step": step}).encode()}
        for name, obj in self.states.items():
            skeleton = _split(obj.state_dict(), name, out)
            out[f"{name}.__rest__"] = _dumps(skeleton)
        if self.rng:
            out["rng.torch"] = bytes(torch.get_rng_state().numpy().tobytes())
            out["rng.python"] = _dumps(random.getstate())
        return out

    def template(self, step: int) -> dict[str, Tensor | bytes]:
        """:meth:`values` with every optimizer's state materialized first (an optimizer that has not
        stepped holds no moments, and a restore needs every saved name, shape and dtype in place).
        Only for a restore: the materialized moments are overwritten by it."""
        for obj in self.states.values():
            if isinstance(obj, torch.optim.Optimizer) and not obj.state:
                _materialize(obj)
        return self.values(step)

    def load(self, values: StateValues) -> int:
        """Load ``values`` (from :meth:`values` or a restore) into the objects; returns the step.

        Raises:
            CheckpointError: an entry is missing or unreadable (``key`` names it).
        """
        for name, obj in self.states.items():
            key = f"{name}.__rest__"
            if key not in values:
                raise CheckpointError(f"the state has no entry {key!r} (saved with other state names?)", key=key)
            obj.load_state_dict(_join(_loads(bytes(values[key]), key), name, values))
        if self.rng and "rng.torch" in values:
            torch.set_rng_state(torch.frombuffer(bytearray(values["rng.torch"]), dtype=torch.uint8).clone())
            state = _loads(bytes(values["rng.python"]), "rng.python")
            random.setstate((state[0], tuple(state[1]), state[2]))
        return int(json.loads(bytes(values[STEP_KEY]))["step"])

    def snapshot(self, step: int) -> dict[str, Tensor | bytes]:
        """A copy of :meth:`values` that later training does not change (tensors cloned)."""
        return {k: v.clone() if isinstance(v, Tensor) else v for k, v in self.values(step).items()}


def _split(node: object, path: str, out: dict[str, Tensor | bytes]) -> Node:
    """The skeleton of ``node`` (tensors replaced by a marker) and its tensors added to ``out``."""
    if isinstance(node, Tensor):
        if path in out:
            raise ConfigError(f"two state entries are named {path!r}", field="states", key=path)
        t = node.detach()
        out[path] = (t if t.device.type == "cpu" else t.cpu()).contiguous()
        return _TENSOR
    if isinstance(node, Mapping):
        return {k: _split(v, f"{path}.{k}", out) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_split(v, f"{path}.{i}", out) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    if isinstance(node, _PLAIN):
        return node
    raise ConfigError(f"state entry {path!r} is a {type(node).__name__}: a state dict may hold tensors, "
                      "dicts, lists, tuples and scalars", field="states", key=path)


def _join(node: object, path: str, values: StateValues) -> object:
    """The inverse of :func:`_split`: the skeleton with its tensors taken from ``values``."""
    if node == _TENSOR and isinstance(node, str):
        if path not in values:
            raise CheckpointError(f"the state has no tensor {path!r}", key=path)
        return values[path]
    if isinstance(node, dict):
        return {k: _join(v, f"{path}.{k}", values) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_join(v, f"{path}.{i}", values) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    return node


def _materialize(optim: torch.optim.Optimizer) -> None:
    """Create ``optim``'s per-parameter state without changing a parameter: one step on zero
    gradients at learning rate 0 (as ``torch.distributed.checkpoint.state_dict`` does before a load)."""
    params = [p for group in optim.param_groups for p in group["params"] if p.requires_grad]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [group["lr"] for group in optim.param_groups]
    for group in optim.param_groups:
        group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], Tensor) else 0.0
    try:
        optim.step()
    finally:
        for group, lr in zip(optim.param_groups, lrs):
            group["lr"] = lr
        for p, grad in zip(params, saved):
            p.grad = grad
