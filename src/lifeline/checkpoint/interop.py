"""Interop with torch.distributed.checkpoint (DCP) and safetensors.

- :func:`export_dcp`: our checkpoint -> a DCP checkpoint directory of full (consolidated)
  tensors plus byte entries; ``torch.distributed.checkpoint.load`` reads it back.
- :func:`import_dcp`: a DCP checkpoint (any number of saving ranks, sharded or not) -> our
  format as a one-rank checkpoint with every tensor whole; from there any layout loads it
  through the ordinary planner (resharding).
- :func:`export_safetensors`: our checkpoint -> one consolidated ``.safetensors`` file.

``torch.distributed.checkpoint`` is imported inside the two DCP functions: it takes seconds to
import (2.1 s measured after torch on a 2-core VM) and is missing from torch builds without
distributed support, neither of which :func:`export_safetensors` should pay for.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Any, Sequence

import torch
from safetensors.torch import save_file

from lifeline.checkpoint._checkpoint import consolidate, read_manifest, save_states
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._manifest import Manifest
from lifeline.checkpoint._patterns import Replicated
from lifeline.checkpoint._readers import StorageBlobReader
from lifeline.checkpoint._rules import PatternRules
from lifeline.checkpoint._storage import Storage
from lifeline.errors import ManifestError, StorageError

__all__ = ["export_dcp", "import_dcp", "export_safetensors"]


def _bytes_of(storage: Storage, prefix: str, job: str, manifest: Manifest, rank: int) -> dict[str, bytes]:
    reader = StorageBlobReader(storage, prefix, job)
    out = {}
    for key, meta in manifest.bytes_entries.get(rank, {}).items():
        data = reader.read(manifest.step, rank, meta.byte_offset, meta.byte_length) if meta.byte_length else b""
        meta.verify(memoryview(data), rank=rank)
        out[key] = bytes(data)
    return out


def export_dcp(storage: Storage, prefix: str, job: str, step: int, path: str | os.PathLike, *,
               bytes_rank: int = 0, thread_count: int = 4) -> list[str]:
    """Write checkpoint ``step`` as a DCP checkpoint at directory ``path``; returns the names written.

    Tensors are consolidated (full logical shape, verified); byte entries of ``bytes_rank``
    are stored as DCP byte items (``io.BytesIO``). Runs without a process group. Raises as
    :func:`consolidate` (:class:`ManifestError`, :class:`ChecksumError`, :class:`StorageError`).
    """
    import torch.distributed.checkpoint as dcp  # imported on use: see the module docstring

    manifest = read_manifest(storage, prefix, job, step)
    state: dict[str, Any] = dict(consolidate(storage, prefix, job, step, manifest=manifest))
    for key, data in _bytes_of(storage, prefix, job, manifest, bytes_rank).items():
        state[key] = io.BytesIO(data)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(path), thread_count=thread_count), no_dist=True)
    return sorted(state)


def import_dcp(path: str | os.PathLike, storage: Storage, prefix: str, job: str, step: int, *,
               names: Sequence[str] | None = None) -> Manifest:
    """Import the DCP checkpoint at ``path`` as checkpoint ``step`` of ``job`` (one rank, every tensor whole).

    DCP byte items become byte entries (their raw bytes, or the ``torch.save`` pickle of a
    non-bytes object). Load it into any layout with :func:`lifeline.checkpoint.load` and
    the model's rules. Raises :class:`ManifestError` when ``path`` holds no DCP metadata.
    """
    import torch.distributed.checkpoint as dcp  # imported on use: see the module docstring
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    reader = dcp.FileSystemReader(os.fspath(path))
    try:
        metadata = reader.read_metadata()
    except (OSError, EOFError, ValueError) as err:
        raise ManifestError(f"no readable DCP metadata at {path}: {err}", key=os.fspath(path)) from err
    state: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if names is not None and fqn not in names:
            continue
        if isinstance(md, TensorStorageMetadata):
            state[fqn] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        elif isinstance(md, BytesStorageMetadata):
            state[fqn] = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    ours: dict[str, Any] = {}
    for fqn, value in state.items():
        if isinstance(value, torch.Tensor):
            ours[fqn] = value.contiguous()
        elif isinstance(value, io.BytesIO):
            ours[fqn] = value.getvalue()
        elif isinstance(value, (bytes, bytearray)):
            ours[fqn] = bytes(value)
        else:
            buf = io.BytesIO()
            torch.save(value, buf)
            ours[fqn] = buf.getvalue()
    return save_states(storage, prefix, job, step, Layout(), PatternRules(default=Replicated()), [ours])


def export_safetensors(storage: Storage, prefix: str, job: str, step: int, path: str | os.PathLike) -> list[str]:
    """Write every tensor of checkpoint ``step``, consolidated, to one safetensors file; returns the names.

    Byte entries are not tensors and are left out (safetensors holds tensors only); the
    manifest's job, step and layout go into the file's metadata. Raises as :func:`consolidate`,
    and :class:`StorageError` naming ``path`` when the file cannot be written.
    """
    manifest = read_manifest(storage, prefix, job, step)
    tensors = consolidate(storage, prefix, job, step, manifest=manifest)
    try:
        save_file(tensors, os.fspath(path), metadata={"job": job, "step": str(step),
                                                    "layout": str(manifest.layout.to_dict())})
    except OSError as err:
        raise StorageError(f"cannot write {path}: {err}", key=os.fspath(path)) from err
    return sorted(tensors)
