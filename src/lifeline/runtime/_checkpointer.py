"""The ``Checkpointer`` protocol and its storage-backed implementation (no sidecar)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from lifeline.checkpoint import (
    Layout,
    PatternRules,
    ShardMetadata,
    Storage,
    blob_key,
    commit,
    list_steps,
    load,
    plan_shard,
    seal_shard,
    write_shard,
)
from lifeline.errors import CheckpointError, StorageError

__all__ = ["Checkpointer", "StorageCheckpointer", "State"]

State = Mapping[str, "Tensor | bytes"]


@runtime_checkable
class Checkpointer(Protocol):
    """Where a trainer rank saves and restores its state (one shard of each checkpoint).

    ``save(step, state, generation=g)`` hands over this rank's state after ``step`` completed
    optimizer steps (it may return a receipt: ``stall_seconds``, ``waited_seconds``, ``skipped``
    are reported when present); the checkpoint becomes visible (complete) once every rank's
    shard is stored.
    ``restore(step, into=state)`` reads this rank's shard of checkpoint ``step`` (``None``: the
    latest complete one) into the tensors of ``into`` where it can and returns the restored state
    (tensors and byte entries). ``latest_step()`` is the latest complete step or ``None``.
    """

    def save(self, step: int, state: State, *, generation: int = 0) -> Any: ...

    def restore(self, step: int | None = None, *, into: State) -> State: ...

    def latest_step(self) -> int | None: ...


def staged_key(prefix: str, job: str, step: int, rank: int, generation: int) -> str:
    """Where a rank's sealed shard metadata waits for the commit: next to its blob, per generation."""
    base = blob_key(prefix, job, step, rank).rsplit("/", 1)[0]
    return f"{base}/staged/gen-{generation:06d}/rank-{rank}.json"


class StorageCheckpointer:
    """A :class:`Checkpointer` over a ``lifeline.checkpoint`` storage, in the trainer's process.

    For tests and runs without a sidecar (``LIFELINE_CHECKPOINT_URI``). A save plans the shard
    once (``plan_shard``, reused while shapes hold), copies it into a reusable buffer
    (``write_shard``), seals it (crc32c per chunk), stores the blob under the universal-format key,
    then stages the shard's metadata under ``.../staged/gen-<g>/rank-<r>.json``. The rank that finds
    every rank's metadata of its generation staged commits the manifest (blobs first, manifest last,
    DESIGN.md); staging per generation keeps a failed generation's leftovers out of a later commit.
    Concurrent commits of one step write the same manifest; ``put`` is atomic.

    Args:
        storage: a ``lifeline.checkpoint`` storage (filesystem, S3, memory).
        prefix: key prefix (``storage_from_uri`` returns it with the storage).
        job, layout, rank, rules: whose shard this is and how its tensors map to logical ones.
    """

    def __init__(self, storage: Storage, prefix: str, job: str, layout: Layout, rank: int, rules: PatternRules) -> None:
        self.storage, self.prefix, self.job = storage, prefix, job
        self.layout, self.rank, self.rules = layout, rank, rules
        self._plan = None
        self._buffer: bytearray | None = None

    def save(self, step: int, state: State, *, generation: int = 0) -> None:
        """Store this rank's shard of ``step`` and commit the checkpoint if it is the last one.

        Raises:
            StorageError: the storage failed (nothing committed for this step).
        """
        if self._plan is None or not self._plan.matches(state):
            self._plan = plan_shard(state, self.layout, self.rank, self.rules)
            self._buffer = bytearray(self._plan.nbytes)
        write_shard(self._plan, state, self._buffer)
        meta = seal_shard(self._plan, self._buffer, job=self.job, step=step)
        self.storage.put(blob_key(self.prefix, self.job, step, self.rank), self._buffer)
        self.storage.put(staged_key(self.prefix, self.job, step, self.rank, generation), meta.to_json().encode())
        self._try_commit(step, generation)

    def _try_commit(self, step: int, generation: int) -> None:
        shards = []
        for r in range(self.layout.world_size):
            key = staged_key(self.prefix, self.job, step, r, generation)
            try:
                shards.append(ShardMetadata.from_json(self.storage.get(key)))
            except StorageError:
                return  # not every rank has saved yet; the last one commits
        commit(self.storage, self.prefix, self.job, step, self.layout, shards)

    def relayout(self, layout: Layout, world_size: int) -> None:
        """Save and restore in ``layout`` from now on (``world_size`` ranks; an elastic reshard)."""
        if layout.world_size != world_size:
            raise CheckpointError(f"layout {layout.to_dict()} has {layout.world_size} ranks, not {world_size}",
                                  job=self.job, rank=self.rank)
        self.layout, self._plan, self._buffer = layout, None, None

    def latest_step(self) -> int | None:
        """The latest committed step, or ``None``."""
        steps = list_steps(self.storage, self.prefix, self.job)
        return max(steps) if steps else None

    def restore(self, step: int | None = None, *, into: State) -> State:
        """Read this rank's part of checkpoint ``step`` (default: latest) into ``into``; verified.

        Raises:
            CheckpointError: no committed checkpoint (``step`` names the one asked for), or the
                stored copy fails verification (``ChecksumError``).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError("no committed checkpoint to restore", job=self.job, rank=self.rank)
        out = dict(into)  # tensors are filled in place; byte entries are replaced in this copy
        load(self.storage, self.prefix, self.job, step, self.layout, self.rank, self.rules, out)
        return out
