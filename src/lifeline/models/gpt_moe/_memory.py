"""A measure of activation memory: bytes of the tensors autograd keeps for the backward pass."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["SavedActivations"]


class _Held:
    """A saved tensor, handed back to autograd on unpack; its storage is counted while it lives."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


class SavedActivations:
    """Peak bytes of activations saved for backward while the context is open (this thread's graphs).

    A ``torch.autograd.graph.saved_tensors_hooks`` pair counts each distinct storage a saved tensor
    lives in (float32 activations, int64 indices, ...) from the moment autograd saves it until the
    last graph holding it is freed (after its backward). Storages of ``params`` (weights saved by
    ``linear`` and the like) are not activations and are not counted. Tensor values are untouched:
    unpack returns the very tensor that was packed, so the step is bit-identical with or without it.

    ``peak_bytes`` (int, bytes) is the most held at once, ``bytes`` what is held now.
    """

    def __init__(self, params: Iterable[Tensor] = ()) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in params}
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self.bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> SavedActivations:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def reset_peak(self) -> None:
        """Start a new peak from what is held now (e.g. at the start of each step)."""
        self.peak_bytes = self.bytes

    def _pack(self, tensor: Tensor) -> Any:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._params or storage.nbytes() == 0:
            return tensor
        if key not in self._refs:
            self._refs[key] = 0
            self._sizes[key] = storage.nbytes()
            self.bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        self._refs[key] += 1
        held = _Held(tensor)
        weakref.finalize(held, self._release, key)
        return held

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if not self._refs[key]:
            del self._refs[key]
            self.bytes -= self._sizes.pop(key)

    @staticmethod
    def _unpack(held: Any) -> Tensor:
        return held.tensor if isinstance(held, _Held) else held
