"""Whole-checkpoint operations: save and commit (manifest last), list, load, consolidate, verify.

Keys are in ``_keys`` (re-exported here); every operation takes a :class:`Storage` and uses
its optional capabilities (``_storage``) where it has them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, MutableMapping, Sequence

import torch

from lifeline.checkpoint._keys import MANIFEST_RE, blob_key, manifest_key, step_prefix
from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._loader import LoadReport, execute_load
from lifeline.checkpoint._manifest import Manifest
from lifeline.checkpoint._shard_metadata import DEFAULT_BLOCK_SIZE, ShardMetadata, seal_entries, seal_shard
from lifeline.checkpoint._patterns import Replicated
from lifeline.checkpoint._persist import fused_put
from lifeline.checkpoint._shard_plan import ALIGN, ShardPlan, dtype_from_name, plan_shard, shard_buffers, write_shard
from lifeline.checkpoint._load_plan import plan_load
from lifeline.checkpoint._readers import BlobReader, StorageBlobReader
from lifeline.checkpoint._rules import PatternRules
from lifeline.checkpoint._storage import Storage, SupportsPutStream, SupportsSize
from lifeline.errors import ChecksumError, ManifestError, StorageError

__all__ = [
    "step_prefix", "blob_key", "manifest_key",  # from _keys
    "save_blob", "persist_shard", "persist_state", "commit", "save", "save_states", "list_steps",
    "read_manifest", "load_shard", "load", "consolidate", "delete_step", "verify_checkpoint",
]


def save_blob(storage: Storage, prefix: str, meta: ShardMetadata, blob: Any) -> None:
    """Put one rank's blob: the first ``meta.nbytes`` bytes of ``blob`` (a bytes-like object or a CPU tensor).

    Refuses to touch a committed step; that and a failed write are a :class:`StorageError`.
    """
    if storage.exists(manifest_key(prefix, meta.job, meta.step)):
        raise StorageError(f"step {meta.step} is already committed; delete it before saving it again",
                           job=meta.job, step=meta.step, key=manifest_key(prefix, meta.job, meta.step))
    data = memoryview(blob.numpy() if isinstance(blob, torch.Tensor) else blob).cast("B")[: meta.nbytes]
    storage.put(blob_key(prefix, meta.job, meta.step, meta.rank), data)


def persist_shard(storage: Storage, prefix: str, plan: ShardPlan, blob: Any, *, job: str, step: int,
                  block_size: int | None = DEFAULT_BLOCK_SIZE) -> ShardMetadata:
    """Seal ``blob`` (written by ``write_shard(plan, ...)``) and put it; returns the metadata.

    On a storage with ``put_stream`` (:class:`SupportsPutStream`: the filesystem) each ~1 MiB segment is checksummed and
    then written at once, while it is cache-hot (one pass over memory, no second thread; see
    ``_persist``); a failure while sealing aborts the write, so no blob is stored. Elsewhere
    (S3) checksumming (crc32c releases the GIL) runs in a thread beside the upload of the same
    bytes and, if sealing fails, the stored blob is removed again (the step is not committed,
    so nothing visible changes). Refuses a committed step (:class:`StorageError`); a blob
    shorter than ``plan.nbytes`` is a :class:`ChecksumError`.
    """
    key = blob_key(prefix, job, step, plan.rank)
    if storage.exists(manifest_key(prefix, job, step)):
        raise StorageError(f"step {step} is already committed; delete it before saving it again",
                           job=job, step=step, key=manifest_key(prefix, job, step))
    data = memoryview(blob.numpy() if isinstance(blob, torch.Tensor) else blob).cast("B")[: plan.nbytes]
    if isinstance(storage, SupportsPutStream):
        if len(data) < plan.nbytes:
            raise ChecksumError(f"blob has {len(data)} bytes, plan needs {plan.nbytes}", rank=plan.rank, step=step)
        ro = data.toreadonly()
        return fused_put(storage, key, plan, lambda e: ro[e.byte_offset : e.byte_offset + e.byte_length],
                         lambda start, stop: ro[start:stop], job=job, step=step, block_size=block_size)
    return _put_while_sealing(storage, key, data,
                              lambda: seal_shard(plan, blob, job=job, step=step, block_size=block_size))


def persist_state(storage: Storage, prefix: str, plan: ShardPlan, state: Mapping[str, Any], *, job: str, step: int,
                  block_size: int | None = DEFAULT_BLOCK_SIZE) -> ShardMetadata:
    """Write rank ``plan.rank``'s blob straight from ``state``'s tensors (no staging copy); returns the metadata.

    For a trainer persisting without a sidecar: the blob is a gather write over the tensors'
    own memory, checksummed from the same memory: fused per segment with the write on a
    storage with ``put_stream`` (``writev`` on the filesystem), in a parallel thread
    elsewhere. The tensors must not change until it returns. Same blob bytes and guarantees
    as :func:`write_shard` + :func:`persist_shard`.
    """
    key = blob_key(prefix, job, step, plan.rank)
    if storage.exists(manifest_key(prefix, job, step)):
        raise StorageError(f"step {step} is already committed; delete it before saving it again",
                           job=job, step=step, key=manifest_key(prefix, job, step))
    buffers, by_offset = shard_buffers(plan, state)
    if isinstance(storage, SupportsPutStream):
        zeros = memoryview(bytes(ALIGN))
        return fused_put(storage, key, plan, lambda e: by_offset[e.byte_offset] if e.byte_length else zeros[:0],
                         lambda start, stop: zeros[: stop - start], job=job, step=step, block_size=block_size)
    return _put_while_sealing(storage, key, buffers,
                              lambda: seal_entries(plan, lambda off, n: by_offset[off] if n else b"", job=job,
                                                   step=step, block_size=block_size))


def _put_while_sealing(storage: Storage, key: str, data: Any, seal: Callable[[], ShardMetadata]) -> ShardMetadata:
    """Write ``data`` at ``key`` while ``seal()`` checksums the same memory in a second thread.

    A failed write cancels the sealing; a failed sealing deletes the written blob, so nothing
    half-verified stays at ``key``. Returns what ``seal()`` returns.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        sealing = pool.submit(seal)
        try:
            storage.put(key, data)
        except BaseException:
            sealing.cancel()
            raise
        try:
            return sealing.result()
        except BaseException:
            storage.delete(key)
            raise


def commit(storage: Storage, prefix: str, job: str, step: int, layout: Layout,
           shards: Sequence[ShardMetadata]) -> Manifest:
    """Write the manifest, the commit marker, after checking every blob is stored. Returns it.

    Raises :class:`ManifestError` when shards disagree and :class:`StorageError` naming a
    missing blob; on error nothing is written.
    """
    manifest = Manifest.from_shards(job, step, layout, shards)
    for r in range(layout.world_size):
        key = blob_key(prefix, job, step, r)
        if not storage.exists(key):
            raise StorageError(f"blob of rank {r} is missing; save it before committing", job=job, step=step,
                               rank=r, key=key)
    storage.put(manifest_key(prefix, job, step), manifest.to_json().encode())
    return manifest


def save(storage: Storage, prefix: str, job: str, step: int, layout: Layout,
         shards_and_blobs: Sequence[tuple[ShardMetadata, Any]], *, threads: int = 4) -> Manifest:
    """Store every rank's blob (on ``threads`` threads), then commit the manifest. Returns it.

    Raises as :func:`save_blob` and :func:`commit`; the step is not committed then.
    """
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(lambda mb: save_blob(storage, prefix, mb[0], mb[1]), shards_and_blobs))
    return commit(storage, prefix, job, step, layout, [m for m, _ in shards_and_blobs])


def save_states(storage: Storage, prefix: str, job: str, step: int, layout: Layout, rules: PatternRules,
                states: Sequence[Mapping[str, Any]], *, block_size: int | None = DEFAULT_BLOCK_SIZE) -> Manifest:
    """Plan, write, seal and save one state per rank (``states[r]`` for rank ``r``), then commit.

    A single-process convenience over :func:`plan_shard`, :func:`write_shard`,
    :func:`seal_shard` and :func:`save`. Raises :class:`ManifestError` when ``states`` has not
    one state per rank, :class:`LayoutError` when a state does not fit ``layout``, and as
    :func:`save`.
    """
    if len(states) != layout.world_size:
        raise ManifestError(f"got {len(states)} states for world size {layout.world_size}", job=job, step=step)
    out = []
    for r, state in enumerate(states):
        plan = plan_shard(state, layout, r, rules)
        blob = bytearray(plan.nbytes)
        write_shard(plan, state, blob)
        out.append((seal_shard(plan, blob, job=job, step=step, block_size=block_size), blob))
    return save(storage, prefix, job, step, layout, out)


def list_steps(storage: Storage, prefix: str, job: str) -> list[int]:
    """Committed steps (those with a manifest) of ``job``, ascending; :class:`StorageError` when listing fails."""
    base = "/".join(p for p in (prefix.strip("/"), job) if p) + "/"
    steps = set()
    for key in storage.list(base):
        m = MANIFEST_RE.fullmatch(key[len(base):])
        if m:
            steps.add(int(m.group(1)))
    return sorted(steps)


def read_manifest(storage: Storage, prefix: str, job: str, step: int) -> Manifest:
    """The manifest of ``step``. Raises :class:`ManifestError` when missing or corrupt,
    :class:`FormatVersionError` for an unknown version."""
    key = manifest_key(prefix, job, step)
    try:
        text = storage.get(key)
    except StorageError as err:
        raise ManifestError(f"no manifest: step {step} of job {job!r} is not committed ({err.message})",
                            job=job, step=step, key=key) from err
    manifest = Manifest.from_json(text, key=key)
    if manifest.job != job or manifest.step != step:
        raise ManifestError(f"manifest is for job={manifest.job} step={manifest.step}", job=job, step=step, key=key)
    return manifest


def load_shard(manifest: Manifest, reader: BlobReader, layout: Layout, rank: int, rules: PatternRules,
               into: MutableMapping[str, Any], *, bytes_rank: int | None = None, threads: int = 4) -> LoadReport:
    """Load rank ``rank`` of ``layout`` from ``manifest`` through a :class:`BlobReader`.

    ``into`` maps names to the target's local tensors (filled in place, verified) and byte
    entry names to placeholders (replaced by the stored bytes). Reads only the byte ranges
    the target needs (see :func:`plan_load`); falls back to the next copy of a chunk on
    :class:`ChecksumError`/:class:`StorageError`. Returns a :class:`LoadReport`.
    """
    plan = plan_load(manifest, layout, rank, rules, into, bytes_rank=bytes_rank)
    return execute_load(plan, manifest, reader, into, threads=threads)


def load(storage: Storage, prefix: str, job: str, step: int, layout: Layout, rank: int, rules: PatternRules,
         into: MutableMapping[str, Any], *, bytes_rank: int | None = None, threads: int = 4) -> LoadReport:
    """Read ``step``'s manifest from ``storage`` and :func:`load_shard` into ``into``.

    Raises as :func:`read_manifest` (no such step) and :func:`load_shard`.
    """
    manifest = read_manifest(storage, prefix, job, step)
    return load_shard(manifest, StorageBlobReader(storage, prefix, job), layout, rank, rules, into,
                      bytes_rank=bytes_rank, threads=threads)


def consolidate(storage: Storage | None = None, prefix: str = "", job: str = "", step: int = 0, *,
                manifest: Manifest | None = None, reader: BlobReader | None = None, names: Sequence[str] | None = None,
                threads: int = 4, fallbacks: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The full logical tensors of a checkpoint (every tensor, or ``names``), verified.

    Uses the same planner as a reshard, with a one-rank target that holds every tensor
    whole. Give ``storage``/``prefix``/``job``/``step``, or ``manifest`` and a ``reader``.
    Raises :class:`ManifestError` for a missing step or tensor, and :class:`ChecksumError` or
    :class:`StorageError` when no copy of a chunk can be read intact. ``fallbacks``, if given, is
    extended with one line per chunk read from another copy because its first copy was corrupt or
    unreadable (naming that copy).
    """
    if manifest is None:
        manifest = read_manifest(storage, prefix, job, step)
    if reader is None:
        reader = StorageBlobReader(storage, prefix, job)
    wanted = sorted(manifest.tensors) if names is None else list(names)
    into: dict[str, Any] = {}
    for fqn in wanted:
        rec = manifest.tensors.get(fqn)
        if rec is None:
            raise ManifestError(f"checkpoint has no tensor {fqn!r}", key=fqn, step=manifest.step)
        into[fqn] = torch.empty(rec.shape, dtype=dtype_from_name(rec.dtype))
    report = load_shard(manifest, reader, Layout(), 0, PatternRules(default=Replicated()), into, threads=threads)
    if fallbacks is not None:
        fallbacks.extend(report.fallbacks)
    return into


def delete_step(storage: Storage, prefix: str, job: str, step: int) -> None:
    """Remove a checkpoint: the manifest first (the step stops existing), then its blobs.

    No error when the step does not exist; :class:`StorageError` when a delete fails.
    """
    storage.delete(manifest_key(prefix, job, step))
    for key in storage.list(step_prefix(prefix, job, step) + "/"):
        storage.delete(key)


VERIFY_WINDOW = 64 << 20
"""Most bytes :func:`verify_checkpoint` holds in memory at once (one reused buffer)."""


def verify_checkpoint(storage: Storage, prefix: str, job: str, step: int, *, window: int = VERIFY_WINDOW) -> Manifest:
    """Read every blob of ``step`` and check every chunk and byte entry; returns the manifest.

    Each blob is read in order, in block-aligned ranges of at most ``window`` bytes into one
    reused buffer, so memory stays bounded whatever the blob size (a byte entry is read whole).
    Raises :class:`ChecksumError` naming the first bad chunk (tensor, offsets, block) or byte
    entry, :class:`StorageError` naming a missing blob or one whose length differs from the
    manifest's.
    """
    manifest = read_manifest(storage, prefix, job, step)
    reader = StorageBlobReader(storage, prefix, job)
    size_of = storage.size if isinstance(storage, SupportsSize) else lambda key: len(storage.get(key))
    buf = bytearray(max(1, min(window, max(manifest.blobs, default=0))))
    for r, nbytes in enumerate(manifest.blobs):
        key = blob_key(prefix, job, step, r)
        size = size_of(key)
        if size != nbytes:
            raise StorageError(f"blob has {size} bytes, manifest says {nbytes}", job=job, step=step, rank=r, key=key)
        chunks = sorted(((ref.chunk, fqn) for fqn, rec in manifest.tensors.items() for ref in rec.chunks
                         if ref.rank == r), key=lambda x: x[0].byte_offset)
        for c, fqn in chunks:
            span = max(c.block_size, window // c.block_size * c.block_size)
            for start in range(0, c.byte_length, span):
                n = min(span, c.byte_length - start)
                view = memoryview(buf)[:n] if n <= len(buf) else memoryview(bytearray(n))
                reader.read_into(step, r, c.byte_offset + start, view)
                c.verify(view, start, name=fqn, rank=r)
        for meta in manifest.bytes_entries.get(r, {}).values():
            data = reader.read(step, r, meta.byte_offset, meta.byte_length) if meta.byte_length else b""
            meta.verify(memoryview(data), rank=r)
    return manifest
