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
  (the number of completed optimizer steps, JSON) are byte entries too;
* a ``DTensor`` (FSDP2, tensor parallelism: what ``get_state_dict`` returns) is its local shard, laid
  out by the ``placed`` pattern of its global shape and placements (:mod:`lifeline.runtime._dtensor`),
  which :attr:`StatefulState.rules` gives the checkpointer; a load wraps the shard on the live mesh.

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
from torch.distributed.tensor import DTensor

from lifeline.checkpoint import PatternRules
from lifeline.errors import CheckpointError, ConfigError
from lifeline.runtime._dtensor import LiveShard, StateRules, live_shard, rebuild
from lifeline.sidecar.client import HostStager

__all__ = ["Stateful", "StatefulState", "StateValues", "STEP_KEY"]

StateValues = Mapping[str, Union[Tensor, bytes]]
"""A flat checkpoint state: fully qualified name → CPU tensor or byte entry."""

STEP_KEY = "loop.step"
_RESERVED = ("rng", "loop")
_TENSOR = "\x00tensor"  # where a tensor stood in a state dict's skeleton
_DTENSOR = "\x00dtensor"  # where a DTensor stood (its shard is the entry)
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
        rules: the patterns of the plain tensors (default all replicated); :attr:`rules` adds the
            ``placed`` pattern of every DTensor entry: give the checkpointer that.

    Raises:
        ConfigError: a bad name, or an object without ``state_dict``/``load_state_dict``.
    """

    def __init__(self, states: Mapping[str, Stateful], *, rng: bool = True, rules: PatternRules | None = None) -> None:
        for name, obj in states.items():
            if not name or "." in name or name in _RESERVED:
                raise ConfigError(f"state name {name!r}: use a non-empty name without dots, not one of {_RESERVED}",
                                  field="states", key=name)
            if not isinstance(obj, Stateful):
                raise ConfigError(f"state {name!r} ({type(obj).__name__}) has no state_dict()/load_state_dict()",
                                  field="states", key=name)
        self.states = dict(states)
        self.rng = rng
        self.rules = StateRules(rules)
        self.live: dict[str, LiveShard] = {}  # DTensor entries as the state was last taken
        self.stager = HostStager(keep=None)  # device tensors' pinned host copies, one per entry

    @property
    def sharded(self) -> bool:
        """Whether the state, as last taken, holds DTensor entries (then the checkpointer needs :attr:`rules`)."""
        return bool(self.live)

    def values(self, step: int) -> dict[str, Tensor | bytes]:
        """The flat state after ``step`` completed optimizer steps. Model tensors are the live ones
        (a restore fills them in place); tensors off the CPU are staged to host memory (a pinned
        buffer per entry, reused from save to save, copied on a side stream; waited for before this
        returns: :class:`~lifeline.sidecar.client.HostStager`).

        Raises:
            ConfigError: a state dict holds a value that is neither a tensor nor a plain container/scalar.
        """
        out: dict[str, Tensor | bytes] = {STEP_KEY: json.dumps({"step": step}).encode()}
        live: dict[str, LiveShard] = {}
        for name, obj in self.states.items():
            skeleton = _split(obj.state_dict(), name, out, live, self.stager)
            out[f"{name}.__rest__"] = _dumps(skeleton)
        self.stager.ready()
        self.live = live
        self.rules.placed = {path: shard.pattern for path, shard in live.items()}
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
            CheckpointError: an entry is missing or unreadable, or a DTensor entry's shard does not fit
                the live one (``key`` names it).
        """
        for name, obj in self.states.items():
            key = f"{name}.__rest__"
            if key not in values:
                raise CheckpointError(f"the state has no entry {key!r} (saved with other state names?)", key=key)
            skeleton = _loads(bytes(values[key]), key)
            if _has_dtensor(skeleton) and any(p not in self.live for p in _dtensor_paths(skeleton, name)):
                self.values(0)  # the live meshes of entries not taken yet (the step entry is unused)
            obj.load_state_dict(_join(skeleton, name, values, self.live))
        if self.rng and "rng.torch" in values:
            torch.set_rng_state(torch.frombuffer(bytearray(values["rng.torch"]), dtype=torch.uint8).clone())
            state = _loads(bytes(values["rng.python"]), "rng.python")
            random.setstate((state[0], tuple(state[1]), state[2]))
        return int(json.loads(bytes(values[STEP_KEY]))["step"])

    def snapshot(self, step: int) -> dict[str, Tensor | bytes]:
        """A copy of :meth:`values` that later training does not change (tensors cloned)."""
        return {k: v.clone() if isinstance(v, Tensor) else v for k, v in self.values(step).items()}


def _split(node: object, path: str, out: dict[str, Tensor | bytes], live: dict[str, LiveShard],
           stager: HostStager) -> Node:
    """The skeleton of ``node`` (tensors replaced by a marker) and its tensors added to ``out``, on the
    host (a DTensor's local shard, its :class:`LiveShard` added to ``live``)."""
    if isinstance(node, Tensor):
        if path in out:
            raise ConfigError(f"two state entries are named {path!r}", field="states", key=path)
        if isinstance(node, DTensor):
            live[path] = live_shard(node, path)
            out[path] = stager.stage(node.to_local().detach(), path)
            return _DTENSOR
        out[path] = stager.stage(node.detach(), path)
        return _TENSOR
    if isinstance(node, Mapping):
        return {k: _split(v, f"{path}.{k}", out, live, stager) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_split(v, f"{path}.{i}", out, live, stager) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    if isinstance(node, _PLAIN):
        return node
    raise ConfigError(f"state entry {path!r} is a {type(node).__name__}: a state dict may hold tensors, "
                      "dicts, lists, tuples and scalars", field="states", key=path)


def _join(node: object, path: str, values: StateValues, live: Mapping[str, LiveShard]) -> object:
    """The inverse of :func:`_split`: the skeleton with its tensors taken from ``values`` (a DTensor
    entry's shard wrapped on its live mesh)."""
    if isinstance(node, str) and node in (_TENSOR, _DTENSOR):
        if path not in values:
            raise CheckpointError(f"the state has no tensor {path!r}", key=path)
        if node == _TENSOR:
            return values[path]
        if path not in live:
            raise CheckpointError(f"entry {path!r} was saved as a DTensor but the live state has none there", key=path)
        return rebuild(values[path], live[path], path)
    if isinstance(node, dict):
        return {k: _join(v, f"{path}.{k}", values, live) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_join(v, f"{path}.{i}", values, live) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    return node


def _dtensor_paths(node: object, path: str) -> list[str]:
    """The entry names of the DTensor markers in skeleton ``node``."""
    if isinstance(node, str) and node == _DTENSOR:
        return [path]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _dtensor_paths(v, f"{path}.{k}")]
    if isinstance(node, (list, tuple)):
        return [p for i, v in enumerate(node) for p in _dtensor_paths(v, f"{path}.{i}")]
    return []


def _has_dtensor(node: object) -> bool:
    return bool(_dtensor_paths(node, ""))


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
