"""The shared-memory arena: fixed-size slots in a Memory-backed directory.

The sidecar creates ``slots`` files ``slot-<i>.bin`` of ``slot_bytes`` bytes each in the arena
directory (the pod's ``emptyDir`` with ``medium: Memory``; ``/dev/shm/...`` outside Kubernetes),
allocates their pages up front and maps them. The trainer maps the same files (``MAP_SHARED``)
and copies a save's tensor bytes into a slot it was lent; the sidecar then owns the slot and its
content *is* the rank's blob in the universal format. Because the sidecar process holds the
files and mappings, slots survive a trainer crash: that is L0.

Slot states (kept by the sidecar only): ``free`` → ``lent`` (trainer writing) → ``held`` (a
checkpoint, pinned while replication or persistence reads it) → ``free`` (evicted).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from lifeline.errors import ConfigError, SidecarError

__all__ = ["Arena", "ArenaView", "slot_path"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def slot_path(arena_dir: Path, index: int) -> Path:
    """Path of slot ``index``'s file in ``arena_dir``."""
    return Path(arena_dir) / f"slot-{index:03d}.bin"


class Arena:
    """The sidecar's side: creates, pre-allocates and maps the slot files.

    Args:
        arena_dir: Memory-backed directory (created if missing, mode 0700).
        slots: number of slots, >= 2.
        slot_bytes: bytes per slot.

    Raises:
        ConfigError: fewer than 2 slots, or the directory cannot hold the slots (e.g. the
            emptyDir's ``sizeLimit`` is below ``slots * slot_bytes``).
    """

    def __init__(self, arena_dir: Path, slots: int, slot_bytes: int) -> None:
        if slots < 2:
            raise ConfigError("the arena needs at least 2 slots", field="slots")
        self.dir = Path(arena_dir)
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._maps: list[mmap.mmap] = []
        for i in range(slots):
            path = slot_path(self.dir, i)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, slot_bytes)
                try:
                    os.posix_fallocate(fd, 0, slot_bytes)
                except OSError as err:
                    raise ConfigError(
                        f"cannot allocate {slots} x {slot_bytes} bytes in {self.dir}: {err}; raise the "
                        "emptyDir sizeLimit or lower LIFELINE_SLOTS/LIFELINE_SLOT_BYTES",
                        field="slot_bytes",
                    ) from err
                self._maps.append(mmap.mmap(fd, slot_bytes, flags=mmap.MAP_SHARED | _POPULATE))
            finally:
                os.close(fd)

    def view(self, index: int, nbytes: int | None = None) -> memoryview:
        """A writable memoryview of slot ``index`` (its first ``nbytes`` bytes)."""
        mv = memoryview(self._maps[index])
        return mv if nbytes is None else mv[:nbytes]

    def close(self, *, unlink: bool = True) -> None:
        """Unmap every slot and, when ``unlink``, remove the files (and the directory when empty).

        A slot still exported by a live view stays mapped until that view is gone; its pages are
        freed when the last mapping goes.
        """
        for i, m in enumerate(self._maps):
            try:
                m.close()
            except BufferError:
                pass  # a live view still exports it
            if unlink:
                slot_path(self.dir, i).unlink(missing_ok=True)
        self._maps.clear()
        if unlink:
            try:
                self.dir.rmdir()
            except OSError:
                pass  # not empty (the socket, or files of others)


class ArenaView:
    """The trainer's side: maps the sidecar's slot files on first use, keeps the mappings.

    Args:
        arena_dir: the same directory as the sidecar's.
        slot_bytes: bytes per slot (as the sidecar announced on connect).
    """

    def __init__(self, arena_dir: Path, slot_bytes: int) -> None:
        self.dir = Path(arena_dir)
        self.slot_bytes = slot_bytes
        self._maps: dict[int, mmap.mmap] = {}

    def view(self, index: int, nbytes: int | None = None) -> memoryview:
        """A writable memoryview of slot ``index`` (its first ``nbytes`` bytes).

        Raises:
            SidecarError: the slot file is missing or smaller than announced.
        """
        m = self._maps.get(index)
        if m is None:
            try:
                fd = os.open(slot_path(self.dir, index), os.O_RDWR)
            except OSError as err:
                raise SidecarError(f"arena slot {index} is missing in {self.dir}: {err}") from err
            try:
                m = mmap.mmap(fd, self.slot_bytes, flags=mmap.MAP_SHARED | _POPULATE)
            except (OSError, ValueError) as err:
                raise SidecarError(f"cannot map arena slot {index}: {err}") from err
            finally:
                os.close(fd)
            self._maps[index] = m
        mv = memoryview(m)
        return mv if nbytes is None else mv[:nbytes]

    def close(self) -> None:
        """Unmap every slot mapped so far."""
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:
                pass
        self._maps.clear()
