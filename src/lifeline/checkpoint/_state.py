"""Non-tensor state: RNG states and the Stateful protocol for user objects."""

from __future__ import annotations

import pickle
import random
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

from lifeline.errors import ManifestError

__all__ = ["Stateful", "pack_rng_state", "restore_rng_state", "stateful_entries", "load_stateful"]


@runtime_checkable
class Stateful(Protocol):
    """A user object that checkpoints itself (data loaders, schedulers, counters).

    Same shape as ``torch.distributed.checkpoint.stateful.Stateful``.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def pack_rng_state() -> bytes:
    """This process's torch (CPU and CUDA, if initialised), Python and NumPy RNG states as bytes."""
    state = {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def restore_rng_state(data: bytes) -> None:
    """Restore the RNG states :func:`pack_rng_state` captured. Raises :class:`ManifestError` on bad bytes."""
    try:
        state = pickle.loads(data)
        torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
    except (pickle.UnpicklingError, KeyError, TypeError, ValueError, EOFError) as err:
        raise ManifestError(f"not an RNG state entry: {err!r}", key="rng") from err
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state["cuda"]])


def _split(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous()
        return ("__tensor__", path)
    if isinstance(obj, Mapping):
        return {k: _split(v, f"{path}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, f"{path}.{i}", tensors) for i, v in enumerate(obj))
    return obj


def _join(obj: Any, loaded: Mapping[str, Any]) -> Any:
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "__tensor__":
        return loaded[obj[1]]
    if isinstance(obj, dict):
        return {k: _join(v, loaded) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, loaded) for v in obj)
    return obj


def stateful_entries(name: str, obj: Stateful) -> dict[str, Any]:
    """Flatten ``obj.state_dict()`` into state entries: each tensor at ``<name>.<path>``, the rest
    (structure and plain values, pickled) as the byte entry ``<name>.__state__``."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(obj.state_dict(), name, tensors)
    return {**tensors, f"{name}.__state__": pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)}


def load_stateful(name: str, obj: Stateful, loaded: Mapping[str, Any]) -> None:
    """Inverse of :func:`stateful_entries`: rebuild the state dict from ``loaded`` and hand it to ``obj``."""
    key = f"{name}.__state__"
    if key not in loaded:
        raise ManifestError(f"no entry {key!r} for stateful object {name!r}", key=key)
    obj.load_state_dict(_join(pickle.loads(loaded[key]), loaded))
