"""Streaming imports: a checkpoint of full tensors written one tensor at a time, never all in memory.

:func:`import_streamed` plans a one-rank checkpoint (every tensor whole, ``replicated``, so any
layout loads it) from the tensors' shapes and dtypes alone (``meta`` tensors: no memory), then
writes the blob in order through the storage's ``put_stream`` (the filesystem's pipelined writer) or
S3's :meth:`~lifeline.checkpoint.S3Storage.put_unsized` (a multipart upload part by part), asking ``load(name)`` for each tensor only when its bytes are due and
checksumming them right before they are written (:func:`~lifeline.checkpoint._persist.fused_put`).
The importer holds one source tensor at a time (the storage's writer may still hold the pieces it
has queued); the manifest is committed last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lifeline.checkpoint._checkpoint import commit, save
from lifeline.checkpoint._keys import blob_key
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._manifest import Manifest
from lifeline.checkpoint._shard_metadata import DEFAULT_BLOCK_SIZE, seal_shard
from lifeline.checkpoint._patterns import Replicated
from lifeline.checkpoint._persist import fused_put
from lifeline.checkpoint._shard_plan import BytesPlan, ChunkPlan, plan_shard, write_shard
from lifeline.checkpoint._rules import PatternRules
from lifeline.checkpoint._storage import Storage, SupportsPutStream, SupportsPutUnsized
from lifeline.errors import LayoutError

__all__ = ["TensorSpec", "import_streamed"]


class _Unsized:
    """``put_stream`` over :meth:`SupportsPutUnsized.put_unsized` (S3: a multipart upload fed part by part)."""

    def __init__(self, storage: SupportsPutUnsized) -> None:
        self.storage = storage

    def put_stream(self, key: str, pieces: Any) -> None:
        self.storage.put_unsized(key, pieces)


@dataclass(frozen=True)
class TensorSpec:
    """A source tensor known by its ``shape`` and ``dtype`` before it is read."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def import_streamed(storage: Storage, prefix: str, job: str, step: int, entries: Mapping[str, TensorSpec | bytes],
                    load: Callable[[str], torch.Tensor], *, block_size: int | None = DEFAULT_BLOCK_SIZE) -> Manifest:
    """Store ``entries`` as checkpoint ``step`` of ``job``: one rank, every tensor whole and ``replicated``.

    Args:
        storage, prefix, job, step: where the checkpoint goes (``<prefix>/<job>/<step:012d>/``).
        entries: name -> :class:`TensorSpec` (read later with ``load``) or the bytes of a byte entry.
        load: returns the full tensor ``name`` (its shape and dtype as declared); called once per
            tensor, in the blob's order, when its bytes are written; the tensor is dropped after.
        block_size: checksum block size (bytes), as :func:`~lifeline.checkpoint.seal_shard`.

    Returns:
        The committed :class:`Manifest`.

    Raises:
        LayoutError: a loaded tensor's shape or dtype differs from its spec (nothing is committed).
        StorageError: the storage failed (a streamed write leaves no object behind).

    On another storage (memory) the blob is assembled in memory first (one copy of the state).
    """
    skeleton: dict[str, Any] = {
        name: torch.empty(spec.shape, dtype=spec.dtype, device="meta") if isinstance(spec, TensorSpec) else spec
        for name, spec in entries.items()}
    layout = Layout()
    plan = plan_shard(skeleton, layout, 0, PatternRules(default=Replicated()))
    if not isinstance(storage, (SupportsPutStream, SupportsPutUnsized)):
        state = {k: load(k) if isinstance(v, TensorSpec) else v for k, v in entries.items()}
        blob = bytearray(plan.nbytes)
        write_shard(plan, state, blob)
        return save(storage, prefix, job, step, layout, [(seal_shard(plan, blob, job=job, step=step,
                                                                     block_size=block_size), blob)])
    owner = {id(c): t for t in plan.tensors for c in t.chunks}
    current: list[torch.Tensor] = []  # the one source tensor alive while its bytes are written

    def view(entry: ChunkPlan | BytesPlan) -> memoryview:
        if isinstance(entry, BytesPlan):
            return memoryview(entries[entry.key]).cast("B")
        t = owner[id(entry)]
        tensor = load(t.fqn)
        if tuple(tensor.shape) != t.local_shape or tensor.dtype != skeleton[t.fqn].dtype:
            raise LayoutError(f"tensor {t.fqn!r} read as {tuple(tensor.shape)} {tensor.dtype}, declared "
                              f"{t.local_shape} {skeleton[t.fqn].dtype}", key=t.fqn)
        current[:] = [tensor.contiguous()]  # the previous one is released here
        return memoryview(current[0].reshape(-1).view(torch.uint8).numpy()).cast("B")

    zeros = memoryview(bytes(64))

    def gap(start: int, stop: int) -> memoryview:
        return zeros[: stop - start] if stop - start <= len(zeros) else memoryview(bytes(stop - start))

    target = storage if isinstance(storage, SupportsPutStream) else _Unsized(storage)
    meta = fused_put(target, blob_key(prefix, job, step, 0), plan, view, gap, job=job, step=step,
                     block_size=block_size)
    current.clear()
    return commit(storage, prefix, job, step, layout, [meta])
