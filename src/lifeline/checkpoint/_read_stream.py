"""The reader thread of a pipelined load: one sequential stream per rank blob, in large calls.

Also the sizes of a pipelined load: :func:`pipeline_piece` (bytes per call of the reader thread),
:data:`PIPELINE_PIECE` (bytes verified at a time; the largest call) and :data:`PIPELINE_AHEAD`
(bytes of reads the loader queues ahead of the one it verifies).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from lifeline.checkpoint._readers import SupportsReadPiecesInto

__all__ = ["ReadStream", "pipeline_piece", "PIPELINE_PIECE", "PIPELINE_AHEAD", "FAST_READ"]


PIPELINE_PIECE = (4 << 20, 64 << 20)
"""Bytes of the pieces the verifying thread of a pipelined load checks at a time, and the most bytes
the reader thread reads in one call (see :func:`pipeline_piece`)."""


PIPELINE_AHEAD = 128 << 20
"""Bytes of reads queued on the reader thread of a pipelined load beyond the one being verified:
enough for two of its largest calls, so it never waits for the verifier to queue more."""


FAST_READ = 4 << 30
"""Bytes per second above which a read is taken to come from memory (the page cache), not a device."""


def pipeline_piece(left: int, rate: float) -> int:
    """Bytes the reader thread of a pipelined load reads in its next call, with ``left`` bytes to go
    and its last call having read ``rate`` bytes per second (0: no call yet).

    Large calls stream a cold file fastest (256 MiB from this machine's disk: one call 0.12 s,
    64 MiB calls 0.12 s, 32 MiB 0.127 s, 4 to 16 MiB 0.136 s); the verifier starts on a call's
    bytes once the call returns, so the calls shrink towards the end (half of what is left,
    down to :data:`PIPELINE_PIECE` ``[0]``) and little is left to verify after the last one.
    From the page cache (``rate`` above :data:`FAST_READ`) a read is a memcpy as fast as the
    verification, and the smallest calls overlap the two best; the first call is a small one,
    to measure the rate.
    """
    lo, hi = PIPELINE_PIECE
    if rate > FAST_READ or not rate:  # the first call, small, tells which case this is
        return lo
    return max(lo, min(hi, 1 << max(0, (left // 2).bit_length() - 1)))


@dataclass(eq=False)
class _Read:
    """One queued read of ``rank``'s blob: ``pieces`` are ``(offset, scatter list)`` in blob order,
    ``after`` the bytes the plan reads after this read; ``fed`` pieces were handed to the
    reader, ``filled`` of them are reported filled."""

    rank: int
    pieces: list[tuple[int, list[memoryview]]]
    progress: queue.SimpleQueue
    after: int
    fed: int = 0
    filled: int = 0

    def left(self) -> int:
        """Bytes of this read not handed out yet, plus the plan's later reads."""
        return self.after + sum(sum(len(v) for v in views) for _, views in self.pieces[self.fed :])

    def end(self, j: int) -> int:
        """Blob offset (bytes) where piece ``j`` ends."""
        off, views = self.pieces[j]
        return off + sum(len(v) for v in views)


_CLOSE = object()


class ReadStream:
    """A thread that fills queued reads in order while the caller verifies what is already filled.

    Consecutive reads of the same rank's blob go through one ``read_pieces_into`` call of the
    reader (a :class:`SupportsReadPiecesInto`), so the filesystem keeps one open file for them
    and the kernel's readahead keeps its window across reads. Contiguous pieces, of one read or of the next one already
    queued, are merged into calls of about ``size(bytes left, rate of the last call in bytes
    per second)`` bytes: large calls stream a cold file fastest, small ones overlap a fast
    (cached) read best with its verification, and a ``size`` that shrinks towards the end
    leaves little to verify after the last call. For each read, ``progress`` receives the end offset (bytes) of each of
    its pieces once it is filled, then the exception if the read failed, then None once the
    thread is done with the read's buffers.

    ``close`` ends the thread after the reads already queued; the caller must not hand the
    buffers back to their owners before ``close`` returns (nothing is written after it).
    """

    def __init__(self, reader: SupportsReadPiecesInto, step: int, size: Callable[[int, float], int]) -> None:
        self.reader, self.step, self.size = reader, step, size
        self.rate = 0.0  # bytes per second of the last call (0: none yet)
        self._todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="lifeline-read", daemon=True)
        self._thread.start()

    def submit(self, rank: int, pieces: list[tuple[int, list[memoryview]]], after: int) -> queue.SimpleQueue:
        """Queue a read of ``rank``'s blob in ``pieces`` (``after``: bytes the plan reads after it);
        returns its progress queue."""
        progress: queue.SimpleQueue = queue.SimpleQueue()
        self._todo.put(_Read(rank, pieces, progress, after))
        return progress

    def close(self) -> None:
        """Finish the queued reads and stop the thread."""
        self._todo.put(_CLOSE)
        self._thread.join()

    def _take(self, block: bool) -> Any:
        """The next queued read with pieces (empty ones are reported done), ``_CLOSE``, or None when
        none is queued yet and ``block`` is False."""
        while True:
            try:
                item = self._todo.get(block)
            except queue.Empty:
                return None
            if item is _CLOSE or item.pieces:
                return item
            item.progress.put(None)

    def _run(self) -> None:
        cur = self._take(True)
        while cur is not _CLOSE:
            cur = self._stream(cur)

    def _stream(self, first: _Read) -> Any:
        """Fill ``first`` and the queued reads after it of the same rank through one ``read_pieces_into``;
        returns the next read to stream (of another rank), or ``_CLOSE``."""
        rank = first.rank
        state: dict[str, Any] = {"cur": first}
        calls: deque[list[list[Any]]] = deque()  # per call handed out: [read, pieces of it in the call]

        def same(read: Any) -> bool:
            return read is not None and read is not _CLOSE and read.rank == rank

        def feed() -> Iterator[tuple[int, list[memoryview]]]:
            while same(read := state["cur"]):
                start = end = read.pieces[read.fed][0]
                target = self.size(read.left(), self.rate)
                views: list[memoryview] = []
                marks: list[list[Any]] = []
                while same(read) and read.pieces[read.fed][0] == end and (not views or end - start < target):
                    views.extend(read.pieces[read.fed][1])
                    end = read.end(read.fed)
                    read.fed += 1
                    if marks and marks[-1][0] is read:
                        marks[-1][1] += 1
                    else:
                        marks.append([read, 1])
                    if read.fed == len(read.pieces):
                        # never wait here for a read not queued yet: the caller may be waiting for the
                        # pieces of this call before it queues the next read
                        read = state["cur"] = self._take(False)
                calls.append(marks)
                t0 = time.perf_counter()
                yield start, views
                self.rate = (end - start) / max(1e-9, time.perf_counter() - t0)
                if state["cur"] is None:  # every call so far is reported: now wait for the next read
                    state["cur"] = self._take(True)

        try:
            for _ in self.reader.read_pieces_into(self.step, rank, feed()):
                for read, count in calls.popleft():
                    for j in range(read.filled, read.filled + count):
                        read.progress.put(read.end(j))
                    read.filled += count
                    if read.filled == len(read.pieces):
                        read.progress.put(None)
        except BaseException as e:  # the reads of the failed call fail; their verifiers raise it
            failed = [read for read, _ in calls.popleft()] if calls else [state["cur"]]  # [cur]: open failed
            for read in failed:
                read.progress.put(e)
                read.progress.put(None)
            if state["cur"] in failed:  # its pieces not handed out yet are not read either
                state["cur"] = self._take(True)
        return state["cur"] if state["cur"] is not None else self._take(True)
