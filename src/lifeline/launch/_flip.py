"""Flip one byte of a checkpoint copy where it lives, the way a memory or disk error would.

* L0: the rank's arena slot files (the sidecar's shared memory): the slot whose bytes verify against
  the catalog's shard metadata of a step is that step's L0 copy.
* L1: a peer sidecar's replica, a buffer in that process's heap: found by content in its anonymous
  writable mappings and written through ``/proc/PID/mem`` (the process is stopped meanwhile).
* L2: the blob in the object store, read and written back through the storage client.

The byte flipped is in the middle of the shard's largest chunk, so the chunk's checksum covers it.
Nothing here tells the sidecars: detecting the corruption is their job (DESIGN.md invariant 4).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from lifeline.checkpoint import ShardMetadata, Storage, blob_key
from lifeline.errors import ChecksumError, LifelineError

__all__ = ["FLIP_MASK", "flip_offset", "find_slots", "flip_file", "flip_in_process", "flip_stored"]

FLIP_MASK = 0x10
"""The bit flipped (XOR) in the chosen byte."""

_CHUNK = 64 << 20


def flip_offset(meta: ShardMetadata) -> int:
    """Byte offset, in the rank's blob, of the byte to flip: the middle of the largest chunk."""
    chunks = [c for t in meta.tensors for c in t.chunks if c.byte_length > 0]
    if not chunks:
        raise LifelineError("the shard has no tensor bytes to flip", rank=meta.rank, step=meta.step)
    c = max(chunks, key=lambda c: (c.byte_length, -c.byte_offset))
    return c.byte_offset + c.byte_length // 2


def find_slots(arena_dir: Path, meta: ShardMetadata) -> list[tuple[Path, bytes]]:
    """Every slot file of ``arena_dir`` holding a verified copy of ``meta``'s blob, with its bytes, by
    name; empty when none does (evicted, never sealed, or the arena is gone).

    A step can sit in two slots with the same bytes: a step trained again after a rollback is saved
    again, deterministically, into another slot, and the older slot keeps its bytes until it is reused.
    A flip must reach every copy: the sidecar holds the newer one (fuzz seed 3405 flipped only the first
    slot, the restore read the other, and the harness took the intact read for an unreported one).
    """
    try:
        slots = sorted(Path(arena_dir).glob("slot-*.bin"))
    except OSError:
        return []
    found = []
    for path in slots:
        try:
            with open(path, "rb") as f:
                data = f.read(meta.nbytes)
        except OSError:
            continue
        try:
            meta.verify(data)
        except ChecksumError:
            continue
        found.append((path, data))
    return found


def flip_file(path: Path, offset: int) -> None:
    """XOR one byte of ``path`` at ``offset`` with :data:`FLIP_MASK` in place (a mapped file sees it).
    Raises ``OSError``."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ FLIP_MASK]), offset)
    finally:
        os.close(fd)


def _regions(pid: int) -> list[tuple[int, int]]:
    """Anonymous writable mappings of ``pid`` (heap and ``mmap``-ed buffers), as (start, end)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            perms = fields[1]
            name = fields[5] if len(fields) > 5 else ""
            if perms.startswith("rw") and (not name or name in ("[heap]",) or name.startswith("[anon")):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out


def flip_in_process(pid: int, blob: bytes, offset: int) -> int:
    """Flip byte ``offset`` of every whole copy of ``blob`` in process ``pid``'s anonymous memory.

    The process is stopped (SIGSTOP) while its memory is searched and written, and continued after.
    Returns the number of copies flipped (0: none found). Raises ``OSError`` when the memory cannot
    be read or written (no such process, no ptrace permission).
    """
    needle = blob[: min(len(blob), 4096)]
    found = 0
    os.kill(pid, signal.SIGSTOP)
    try:
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            for lo, hi in _regions(pid):
                if hi - lo < len(blob):
                    continue
                pos = lo
                while pos < hi:
                    end = min(hi, pos + _CHUNK + len(blob))
                    try:
                        mem.seek(pos)
                        data = mem.read(end - pos)
                    except OSError:
                        break
                    i = data.find(needle)
                    while 0 <= i < _CHUNK and i + len(blob) <= len(data):
                        if data[i:i + len(blob)] == blob:
                            mem.seek(pos + i + offset)
                            mem.write(bytes([blob[offset] ^ FLIP_MASK]))
                            found += 1
                        i = data.find(needle, i + 1)
                    if end >= hi:
                        break
                    pos += _CHUNK
    finally:
        os.kill(pid, signal.SIGCONT)
    return found


def flip_stored(storage: Storage, prefix: str, job: str, step: int, rank: int, offset: int) -> str:
    """Flip byte ``offset`` of rank ``rank``'s blob of ``step`` in the L2 store (read, flip, write
    back); returns the key. Raises :class:`~lifeline.errors.StorageError`."""
    key = blob_key(prefix, job, step, rank)
    data = bytearray(storage.get(key))
    data[offset] ^= FLIP_MASK
    storage.put(key, bytes(data))
    return key
