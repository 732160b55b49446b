"""Interop with torch.distributed.checkpoint (DCP) and safetensors.

- :func:`export_dcp`: our checkpoint -> a DCP checkpoint directory of full (consolidated)
  tensors plus byte entries; ``torch.distributed.checkpoint.load`` reads it back.
- :func:`import_dcp`: a DCP checkpoint (any number of saving ranks, sharded or not) -> our
  format as a one-rank checkpoint with every tensor whole; from there any layout loads it
  through the ordinary planner (resharding).
- :func:`export_safetensors`: our checkpoint -> one consolidated ``.safetensors`` file.
- :func:`import_safetensors`: a file of full tensors -> a one-rank checkpoint with a replicated
  pattern, which loads into any layout through the model's rules.

Both imports stream: the checkpoint is planned from the tensors' shapes and dtypes, and each tensor
is read from the source only when its bytes are written (:mod:`._streamed`).

Exports write atomically: a temporary name next to the target, then a rename; the result has the
mode the umask gives a new file (or directory), and an existing target is replaced only with
``overwrite=True``.

``torch.distributed.checkpoint`` is imported inside the two DCP functions: it takes seconds to
import (2.1 s measured after torch on a 2-core VM) and is missing from torch builds without
distributed support, neither of which :func:`export_safetensors` should pay for.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lifeline.checkpoint._checkpoint import consolidate, read_manifest
from lifeline.checkpoint._manifest import Manifest
from lifeline.checkpoint._readers import StorageBlobReader
from lifeline.checkpoint._storage import Storage
from lifeline.checkpoint._import_stream import TensorSpec, import_streamed
from lifeline.errors import ManifestError, StorageError

__all__ = ["export_dcp", "import_dcp", "export_safetensors", "import_safetensors"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _place(tmp: Path, path: Path, *, overwrite: bool, mode: int) -> None:
    """Give ``tmp`` the umask's ``mode`` and rename it to ``path`` (replacing it only if ``overwrite``)."""
    os.chmod(tmp, mode & ~_umask())
    if path.exists() or path.is_symlink():
        if not overwrite:
            raise StorageError(f"{path} exists; pass overwrite=True (--force) to replace it", key=os.fspath(path))
        if path.is_dir() and not tmp.is_dir():
            raise StorageError(f"{path} is a directory", key=os.fspath(path))
        if path.is_dir():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
            return
    os.replace(tmp, path)


def _bytes_of(storage: Storage, prefix: str, job: str, manifest: Manifest, rank: int) -> dict[str, bytes]:
    reader = StorageBlobReader(storage, prefix, job)
    out = {}
    for key, meta in manifest.bytes_entries.get(rank, {}).items():
        data = reader.read(manifest.step, rank, meta.byte_offset, meta.byte_length) if meta.byte_length else b""
        meta.verify(memoryview(data), rank=rank)
        out[key] = bytes(data)
    return out


def export_dcp(storage: Storage, prefix: str, job: str, step: int, path: str | os.PathLike, *,
               bytes_rank: int = 0, thread_count: int = 4, overwrite: bool = False,
               fallbacks: list[str] | None = None) -> list[str]:
    """Write checkpoint ``step`` as a DCP checkpoint at directory ``path``; returns the names written.

    Tensors are consolidated (full logical shape, verified); byte entries of ``bytes_rank``
    are stored as DCP byte items (``io.BytesIO``). Runs without a process group. The directory is
    written under a temporary name and renamed (see the module docstring); ``fallbacks`` as in
    :func:`consolidate`. Raises as :func:`consolidate` (:class:`ManifestError`,
    :class:`ChecksumError`, :class:`StorageError`), and :class:`StorageError` when ``path`` exists
    and not ``overwrite``, or cannot be written.
    """
    import torch.distributed.checkpoint as dcp  # imported on use: see the module docstring

    manifest = read_manifest(storage, prefix, job, step)
    state: dict[str, Any] = dict(consolidate(storage, prefix, job, step, manifest=manifest, fallbacks=fallbacks))
    for key, data in _bytes_of(storage, prefix, job, manifest, bytes_rank).items():
        state[key] = io.BytesIO(data)
    target = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as err:
        raise StorageError(f"cannot write {path}: {err.strerror}", key=os.fspath(path)) from err
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(tmp), thread_count=thread_count),
                     no_dist=True)
        _place(tmp, target, overwrite=overwrite, mode=0o777)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(state)


def import_dcp(path: str | os.PathLike, storage: Storage, prefix: str, job: str, step: int, *,
               names: Sequence[str] | None = None) -> Manifest:
    """Import the DCP checkpoint at ``path`` as checkpoint ``step`` of ``job`` (one rank, every tensor whole).

    Streamed (:func:`~lifeline.checkpoint._import_stream.import_streamed`): the byte items are read
    first, then each tensor is read (``dcp.load`` of that one tensor, resharded from however many
    ranks saved it) only when its bytes are written. DCP byte items become byte entries (their raw
    bytes, or the ``torch.save`` pickle of a non-bytes object). Load it into any layout with
    :func:`lifeline.checkpoint.load` and the model's rules. Raises :class:`ManifestError` when
    ``path`` holds no DCP metadata, and as :func:`import_streamed`.
    """
    import torch.distributed.checkpoint as dcp  # imported on use: see the module docstring
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    reader = dcp.FileSystemReader(os.fspath(path))
    try:
        metadata = reader.read_metadata()
    except (OSError, EOFError, ValueError) as err:
        raise ManifestError(f"no readable DCP metadata at {path}: {err}", key=os.fspath(path)) from err
    wanted = {fqn: md for fqn, md in metadata.state_dict_metadata.items() if names is None or fqn in names}

    def dcp_load(state: dict[str, Any]) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=dcp.FileSystemReader(os.fspath(path)), no_dist=True)

    items: dict[str, Any] = {fqn: io.BytesIO() for fqn, md in wanted.items() if isinstance(md, BytesStorageMetadata)}
    if items:
        dcp_load(items)
    entries: dict[str, TensorSpec | bytes] = {fqn: _as_bytes(v) for fqn, v in items.items()}
    entries.update({fqn: TensorSpec(tuple(md.size), md.properties.dtype) for fqn, md in wanted.items()
                    if isinstance(md, TensorStorageMetadata)})

    def load(fqn: str) -> torch.Tensor:
        spec = entries[fqn]
        assert isinstance(spec, TensorSpec)
        one = {fqn: torch.empty(spec.shape, dtype=spec.dtype)}
        dcp_load(one)
        return one[fqn]

    return import_streamed(storage, prefix, job, step, entries, load)


def _as_bytes(value: Any) -> bytes:
    """A DCP byte item as the bytes of a byte entry (a non-bytes object: its ``torch.save`` pickle)."""
    if isinstance(value, io.BytesIO):
        return value.getvalue()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def export_safetensors(storage: Storage, prefix: str, job: str, step: int, path: str | os.PathLike, *,
                       overwrite: bool = False, fallbacks: list[str] | None = None) -> list[str]:
    """Write every tensor of checkpoint ``step``, consolidated, to one safetensors file; returns the names.

    Byte entries are not tensors and are left out (safetensors holds tensors only); the
    manifest's job, step and layout go into the file's metadata. Written under a temporary name
    and renamed, with the umask's mode; ``fallbacks`` as in :func:`consolidate`. Raises as
    :func:`consolidate`, and :class:`StorageError` naming ``path`` when it exists and not
    ``overwrite``, is a directory, or cannot be written.
    """
    manifest = read_manifest(storage, prefix, job, step)
    tensors = consolidate(storage, prefix, job, step, manifest=manifest, fallbacks=fallbacks)
    target = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
        os.close(fd)
    except OSError as err:
        raise StorageError(f"cannot write {path}: {err.strerror}", key=os.fspath(path)) from err
    try:
        save_file(tensors, name, metadata={"job": job, "step": str(step), "layout": str(manifest.layout.to_dict())})
        _place(Path(name), target, overwrite=overwrite, mode=0o666)
    except OSError as err:
        raise StorageError(f"cannot write {path}: {err}", key=os.fspath(path)) from err
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return sorted(tensors)


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
                       "F8_E5M2": torch.float8_e5m2}


def _safetensors_specs(path: str | os.PathLike) -> dict[str, TensorSpec]:
    """Every tensor's shape and dtype from a safetensors file's header (nothing else is read).

    Raises:
        StorageError: not a readable safetensors file, or a dtype torch has no counterpart of.
    """
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= 100 << 20:
                raise ValueError(f"header length {n} is not that of a safetensors file")
            header = json.loads(f.read(n))
        specs = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"tensor {name!r} has dtype {info['dtype']}, which torch cannot hold")
            specs[name] = TensorSpec(tuple(int(d) for d in info["shape"]), dtype)
        return specs
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise StorageError(f"{path} is not a readable safetensors file: {err}", key=os.fspath(path)) from err


def import_safetensors(path: str | os.PathLike, storage: Storage, prefix: str, job: str, step: int) -> Manifest:
    """Import a safetensors file of full tensors as checkpoint ``step`` of ``job``: one rank, every tensor
    with the ``replicated`` pattern, so any layout loads it (the planner slices what each rank needs).

    Streamed (:func:`~lifeline.checkpoint._import_stream.import_streamed`): shapes and dtypes come from the
    file's header, and each tensor is read (memory-mapped) only when its bytes are written, so a
    model's weights larger than this machine's memory import too.

    Raises:
        StorageError: ``path`` cannot be read or is not a safetensors file (naming it); the storage failed.
        ManifestError, LayoutError: as :func:`import_streamed`.
    """
    specs = _safetensors_specs(path)
    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            return import_streamed(storage, prefix, job, step, dict(specs), f.get_tensor)
    except (SafetensorError, OSError) as err:
        raise StorageError(f"{path} is not a readable safetensors file: {err}", key=os.fspath(path)) from err
