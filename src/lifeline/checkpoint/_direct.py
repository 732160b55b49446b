"""Writing a stream of buffers to a file with ``O_DIRECT``: no page cache, one writer thread.

Why: a buffered write copies every byte into the page cache (CPU), and on a host whose page
cache is under pressure the writer is throttled once ~1 GB of cached file data builds up
(measured on the dev VM: 256 MiB + fsync took 0.17 s for the first five files, then 0.8-1.1 s).
``O_DIRECT`` hands the pages of the caller's memory to the device (DMA, no kernel copy) and
leaves the page cache alone, so every save costs the same. The same idea as DeepSpeed's
``FastPersist`` (Wang et al., 2024, "FastPersist: Accelerating Model Checkpointing in Deep
Learning", §4: O_DIRECT writes from aligned, pinned buffers, overlapped with the producer).

How: ``O_DIRECT`` needs the memory address, the length and the file offset of every write to
be multiples of the device's block size (:data:`DIRECT_ALIGN`, 4096, enough for every Linux
block device). A run of pieces that lie back to back in memory from an aligned address (a
blob in the sidecar's page-aligned arena slot) is written straight from that memory; any
other bytes are copied into page-aligned bounce buffers (the copy the kernel would have made
into the page cache). The last partial block is padded with zeros and the file is truncated
to its length afterwards. Writes of up to :data:`DIRECT_WRITE` bytes are handed to a writer
thread (``pwrite`` releases the GIL), so the producer (the checksum of the next segment, the
next bounce copy) overlaps with the device.

:func:`enable_direct` says whether the filesystem takes ``O_DIRECT`` at all (tmpfs before Linux 6.6 does not);
:func:`probe_direct` also tries one aligned write (some filesystems take the flag, then refuse writes).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import queue
import threading
from typing import Any, Iterable

import numpy as np

__all__ = ["DIRECT_ALIGN", "DIRECT_WRITE", "enable_direct", "probe_direct", "write_direct", "write_pipelined"]

DIRECT_ALIGN = 4096
"""Alignment of address, length and offset of every ``O_DIRECT`` write (bytes)."""

DIRECT_WRITE = 4 << 20
"""Bytes per ``pwrite`` handed to the writer thread (and size of one bounce buffer)."""

_DEPTH = 2
"""Writes queued ahead of the writer thread (bounce buffers in use: ``_DEPTH + 2`` at most)."""

_POOL: list[mmap.mmap] = []
_POOL_LOCK = threading.Lock()
_POOL_MAX = 8


def _bounce() -> mmap.mmap:
    with _POOL_LOCK:
        if _POOL:
            return _POOL.pop()
    return mmap.mmap(-1, DIRECT_WRITE)  # anonymous mmap: page-aligned


def _release(buf: mmap.mmap) -> None:
    with _POOL_LOCK:
        if len(_POOL) < _POOL_MAX:
            _POOL.append(buf)
            return
    try:
        buf.close()
    except BufferError:  # a view of it is still alive somewhere: the garbage collector frees it
        pass


def enable_direct(fd: int) -> bool:
    """Set ``O_DIRECT`` on the open file ``fd``; False (file unchanged) when the filesystem refuses it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)
        return True
    except OSError:
        return False


def probe_direct(directory: str) -> bool:
    """Whether an aligned ``O_DIRECT`` write works in ``directory`` (some filesystems accept the flag
    and then refuse the write: FUSE, old overlayfs). Writes and removes one 4 KiB probe file."""
    path = os.path.join(directory, f".direct-probe.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return False
    buf = mmap.mmap(-1, DIRECT_ALIGN)
    try:
        return enable_direct(fd) and os.pwrite(fd, buf, 0) == DIRECT_ALIGN
    except OSError:
        return False
    finally:
        buf.close()
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class _Writer:
    """The writer thread: ``pwrite``s queued ``(buffer, offset, bounce or None, keepalive)`` in order."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.q: queue.Queue = queue.Queue(maxsize=_DEPTH)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="lifeline-direct-write", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            buf, offset, bounce, _keep = job
            job = None
            try:
                if self.error is None:
                    view = memoryview(buf).cast("B")
                    done = 0
                    while done < len(view):
                        n = os.pwrite(self.fd, view[done:], offset + done)
                        if n <= 0:
                            raise OSError(f"pwrite wrote {n} bytes at offset {offset + done}")
                        done += n
            except BaseException as err:  # reported to the producer at its next submit / at close
                self.error = err
            finally:
                # Drop every view of the bounce buffer before it goes back (a pool that is full
                # closes it, which an exported view would refuse), so this loop never dies and
                # a producer blocked on the queue is always served.
                view = buf = _keep = None
                if bounce is not None:
                    _release(bounce)

    def submit(self, buf: Any, offset: int, bounce: mmap.mmap | None, keep: Any = None) -> None:
        if self.error is not None:
            if bounce is not None:
                _release(bounce)
            raise self.error
        self.q.put((buf, offset, bounce, keep))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


def write_pipelined(fd: int, pieces: Iterable[Any]) -> int:
    """Write the concatenation of ``pieces`` to ``fd`` (from offset 0) through the page cache, one writer
    thread ``pwrite``-ing each piece while the producer makes the next (the checksum of the next
    segment overlaps the kernel's copy of this one on another core). Returns the bytes written.
    The pieces' memory must not change until this returns."""
    writer = _Writer(fd)
    pos = 0
    try:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            if len(view):
                writer.submit(view, pos, None)
                pos += len(view)
    finally:
        writer.close()
    if writer.error is not None:
        raise writer.error
    return pos


def write_direct(fd: int, pieces: Iterable[Any]) -> int:
    """Write the concatenation of ``pieces`` (bytes-like, consumed in order) to ``fd`` from offset 0.

    ``fd`` must be open for writing with ``O_DIRECT`` set (:func:`enable_direct`) on an empty
    file. Returns the number of bytes written; the file ends up exactly that long. The pieces'
    memory must not change until this returns. Raises the ``OSError`` of a failed write (or
    whatever ``pieces`` raises) after the writer thread has stopped.
    """
    writer = _Writer(fd)
    pos = 0  # file offset of the next submitted write (multiple of DIRECT_ALIGN)
    total = 0
    cur: mmap.mmap | None = None  # bounce buffer being filled
    fill = 0
    run_addr = run_len = 0  # an aligned run of memory written in place
    run_keep: list[memoryview] = []

    def submit_run(n: int) -> None:
        nonlocal run_addr, run_len, pos, run_keep
        buf = (ctypes.c_char * n).from_address(run_addr)
        writer.submit(buf, pos, None, run_keep if n == run_len else list(run_keep))
        pos += n
        run_addr += n
        run_len -= n
        if not run_len:
            run_keep = []

    def copy(view: memoryview) -> None:
        nonlocal cur, fill, pos
        while len(view):
            if cur is None:
                cur, fill = _bounce(), 0
            k = min(len(view), DIRECT_WRITE - fill)
            cur[fill : fill + k] = view[:k]
            fill += k
            view = view[k:]
            if fill == DIRECT_WRITE:
                writer.submit(cur, pos, cur)
                pos += DIRECT_WRITE
                cur, fill = None, 0

    def close_run() -> None:
        nonlocal run_len, run_keep
        if not run_len:
            return
        aligned = run_len // DIRECT_ALIGN * DIRECT_ALIGN
        if aligned:
            submit_run(aligned)
        if run_len:  # a short tail: through a bounce buffer
            tail = memoryview((ctypes.c_char * run_len).from_address(run_addr)).cast("B")
            copy(tail)
            run_len, run_keep = 0, []

    try:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            n = len(view)
            if not n:
                continue
            total += n
            addr = _address(view)
            if run_len and addr == run_addr + run_len:
                run_len += n
                run_keep.append(view)
            else:
                close_run()
                if fill == 0 and addr % DIRECT_ALIGN == 0:
                    run_addr, run_len, run_keep = addr, n, [view]
                else:
                    copy(view)
                    continue
            while run_len >= DIRECT_WRITE:
                submit_run(DIRECT_WRITE)
        close_run()
        if fill:
            padded = -(-fill // DIRECT_ALIGN) * DIRECT_ALIGN
            cur[fill:padded] = bytes(padded - fill)  # type: ignore[index]
            writer.submit(memoryview(cur)[:padded], pos, cur)
            pos += padded
            cur = None
    except BaseException:
        writer.close()
        if cur is not None:
            _release(cur)
        raise
    writer.close()
    if writer.error is not None:
        raise writer.error
    if pos != total:
        os.ftruncate(fd, total)
    return total
