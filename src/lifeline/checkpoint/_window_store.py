"""Sparse windows in storage (L2): a rank's slots as objects, and a window manifest written last.

A rank's window starting at step ``start`` (W slots, MoEvement §4) is stored as::

    <prefix>/<job>/windows/rank-<r>/slot-<step:012d>.bin     one packed slot per step (start .. start+W-1)
    <prefix>/<job>/windows/rank-<r>/window-<start:012d>.json  the window manifest (the commit marker)

The manifest is written after every slot object of the window is stored; it lists, per slot, the
step, which operators were captured ACTIVE and FROZEN at that step, the object's byte count and
crc32c. A window without its manifest is not restorable; a slot object that no longer matches its
manifest's crc32c is refused (:class:`~lifeline.errors.ChecksumError`). Deleting a window removes
the manifest first, so a reader never sees a committed window with missing slots.

Windows of one rank are independent of its dense checkpoints (``<job>/<step:012d>/...``): the
dense listing (:data:`~lifeline.checkpoint.MANIFEST_RE`) never matches a window key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lifeline.checkpoint._crc import crc32c
from lifeline.checkpoint._slot import SlotRecord, slot_record
from lifeline.checkpoint._storage import Storage
from lifeline.errors import ChecksumError, ManifestError, StorageError

__all__ = ["SlotCopy", "WindowManifest", "window_slot_key", "window_manifest_key", "commit_window",
           "read_window_manifest", "read_window_slot", "window_starts", "delete_window"]

_MANIFEST = re.compile(r"window-(\d{12})\.json$")


def _rank_prefix(prefix: str, job: str, rank: int) -> str:
    return "/".join(p for p in (prefix.strip("/"), job, "windows", f"rank-{rank}") if p)


def window_slot_key(prefix: str, job: str, rank: int, step: int) -> str:
    """``<prefix>/<job>/windows/rank-<r>/slot-<step:012d>.bin``: the slot rank ``rank`` captured at ``step``."""
    return f"{_rank_prefix(prefix, job, rank)}/slot-{step:012d}.bin"


def window_manifest_key(prefix: str, job: str, rank: int, start: int) -> str:
    """``<prefix>/<job>/windows/rank-<r>/window-<start:012d>.json``: the commit marker of a window."""
    return f"{_rank_prefix(prefix, job, rank)}/window-{start:012d}.json"


@dataclass(frozen=True)
class SlotCopy:
    """One stored slot of a window: its :class:`SlotRecord` (step, ACTIVE and FROZEN operators) and
    the object's size in bytes and crc32c (of the whole packed slot)."""

    record: SlotRecord
    nbytes: int
    crc32c: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.record.to_dict(), "step": self.record.step, "nbytes": self.nbytes, "crc32c": self.crc32c}


@dataclass(frozen=True)
class WindowManifest:
    """The manifest of rank ``rank``'s window of W slots starting at ``start`` (the commit marker).

    Raises:
        ManifestError: the slots are not exactly ``start .. start + window - 1`` of one window.
    """

    job: str
    rank: int
    start: int
    window: int
    slots: tuple[SlotCopy, ...]

    def __post_init__(self) -> None:
        got = [(s.record.start, s.record.window, s.record.index) for s in self.slots]
        want = [(self.start, self.window, i) for i in range(self.window)]
        if got != want:
            raise ManifestError(f"window {self.start} of rank {self.rank} needs slots 0..{self.window - 1} of that "
                                f"window in order, got {got}", job=self.job, rank=self.rank, step=self.start)

    @property
    def last_step(self) -> int:
        """The window's last step (``start + window - 1``): a dense state is reached there."""
        return self.start + self.window - 1

    def slot(self, step: int) -> SlotCopy:
        """The slot of ``step``. Raises :class:`ManifestError` when ``step`` is outside the window."""
        if not self.start <= step <= self.last_step:
            raise ManifestError(f"step {step} is outside window {self.start}..{self.last_step}", job=self.job,
                                rank=self.rank, step=step)
        return self.slots[step - self.start]

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "rank": self.rank, "start": self.start, "window": self.window,
                           "slots": [s.to_dict() for s in self.slots]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> WindowManifest:
        """Raises :class:`ManifestError` when malformed."""
        try:
            d = json.loads(text)
            slots = tuple(SlotCopy(SlotRecord.from_dict(s), int(s["nbytes"]), int(s["crc32c"])) for s in d["slots"])
            return cls(str(d["job"]), int(d["rank"]), int(d["start"]), int(d["window"]), slots)
        except (ValueError, KeyError, TypeError) as err:
            raise ManifestError(f"malformed window manifest: {err!r}") from err


def commit_window(storage: Storage, prefix: str, job: str, rank: int, slots: Sequence[SlotCopy]) -> WindowManifest:
    """Write the manifest of a window whose slot objects are all stored (checked first: each exists).

    ``slots``: the window's W slots in order (their records name the window). Returns the manifest.

    Raises:
        ManifestError: the slots are not one whole window.
        StorageError: a slot object is missing (nothing is committed) or the write failed.
    """
    if not slots:
        raise ManifestError("a window has at least one slot", job=job, rank=rank)
    first = slots[0].record
    manifest = WindowManifest(job, rank, first.start, first.window, tuple(slots))
    for s in slots:
        key = window_slot_key(prefix, job, rank, s.record.step)
        if not storage.exists(key):
            raise StorageError(f"slot object {key} is missing; window {first.start} not committed", key=key)
    storage.put(window_manifest_key(prefix, job, rank, first.start), manifest.to_json().encode())
    return manifest


def window_starts(storage: Storage, prefix: str, job: str, rank: int) -> list[int]:
    """Starts of rank ``rank``'s committed windows (manifest present), ascending."""
    base = _rank_prefix(prefix, job, rank) + "/"
    return sorted(int(m.group(1)) for k in storage.list(base) if (m := _MANIFEST.search(k)))


def read_window_manifest(storage: Storage, prefix: str, job: str, rank: int, start: int) -> WindowManifest:
    """The committed manifest of the window starting at ``start``.

    Raises:
        StorageError: no such window is committed.
        ManifestError: the manifest is malformed or names another window.
    """
    manifest = WindowManifest.from_json(storage.get(window_manifest_key(prefix, job, rank, start)))
    if (manifest.job, manifest.rank, manifest.start) != (job, rank, start):
        raise ManifestError(f"window manifest at start {start} of rank {rank} names job {manifest.job!r} rank "
                            f"{manifest.rank} start {manifest.start}", job=job, rank=rank, step=start)
    return manifest


def read_window_slot(storage: Storage, prefix: str, job: str, rank: int, step: int) -> tuple[bytes, WindowManifest]:
    """The packed slot rank ``rank`` captured at ``step``, from the committed window holding it,
    verified against the manifest (size and crc32c), with that manifest.

    Raises:
        StorageError: no committed window of rank ``rank`` holds ``step``.
        ChecksumError: the stored slot does not match its manifest (size or crc32c).
    """
    starts = [s for s in window_starts(storage, prefix, job, rank) if s <= step]
    for start in reversed(starts):
        manifest = read_window_manifest(storage, prefix, job, rank, start)
        if step <= manifest.last_step:
            break
    else:
        raise StorageError(f"no committed sparse window of rank {rank} holds step {step}",
                           key=window_slot_key(prefix, job, rank, step))
    copy = manifest.slot(step)
    key = window_slot_key(prefix, job, rank, step)
    data = storage.get(key)
    if len(data) != copy.nbytes or crc32c(data) != copy.crc32c:
        raise ChecksumError(f"stored slot {key} ({len(data)} bytes) does not match its window manifest "
                            f"({copy.nbytes} bytes, crc32c {copy.crc32c:#010x})", rank=rank, step=step, tier="L2",
                            key=key)
    if slot_record(data) != copy.record:
        raise ChecksumError(f"stored slot {key} holds another slot than its manifest says", rank=rank, step=step,
                            tier="L2", key=key)
    return data, manifest


def delete_window(storage: Storage, prefix: str, job: str, rank: int, start: int) -> None:
    """Delete a committed window: its manifest first (it stops being restorable), then its slots.

    Raises:
        StorageError: a delete failed (a window left without manifest is never read).
    """
    manifest = read_window_manifest(storage, prefix, job, rank, start)
    storage.delete(window_manifest_key(prefix, job, rank, start))
    for s in manifest.slots:
        storage.delete(window_slot_key(prefix, job, rank, s.record.step))
