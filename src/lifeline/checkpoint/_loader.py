"""Executing a load plan: parallel ranged reads, verification, copies, fallback to the next copy."""

from __future__ import annotations

import math
import os
import queue
import threading
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, MutableMapping, Sequence

import torch

from lifeline.checkpoint._manifest import Manifest
from lifeline.checkpoint._shard_plan import copy_into, dtype_from_name
from lifeline.checkpoint._load_plan import CopyOp, LoadPlan
from lifeline.checkpoint._readers import BlobReader, SupportsReadInto, SupportsReadPiecesInto
from lifeline.checkpoint._storage import ReadTuning
from lifeline.checkpoint._read_stream import PIPELINE_AHEAD, PIPELINE_PIECE, ReadStream, pipeline_piece
from lifeline.checkpoint._verify import ReadChecks, Segment
from lifeline.errors import ChecksumError, StorageError

__all__ = ["LoadReport", "execute_load"]

_Streamed = tuple[list[Segment], ReadChecks, queue.SimpleQueue]
"""A read queued on the reader thread: its segments, their checks and its progress queue."""


@dataclass
class LoadReport:
    """What a load did: bytes the target needed, bytes read (fallbacks included), copies skipped.

    ``needed_bytes`` counts the target's tensor bytes and the byte entries it asked for (each read
    whole); ``read_bytes`` every byte read for either, so ``read_bytes / needed_bytes`` is the load's
    read amplification (1.0: nothing read beyond what the target needs).

    ``fallbacks`` lists one line per chunk whose primary copy failed (corrupt or unreadable)
    and that was then read from another copy.
    """

    needed_bytes: int = 0
    read_bytes: int = 0
    reads: int = 0
    fallbacks: list[str] = field(default_factory=list)


def _chunk_strides(shape: tuple[int, ...]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def _u8(buf: Any) -> torch.Tensor:
    mv = memoryview(buf).cast("B")
    if not len(mv):
        return torch.empty(0, dtype=torch.uint8)
    if mv.readonly:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(mv, dtype=torch.uint8)
    return torch.frombuffer(mv, dtype=torch.uint8)


def _widen(intervals, block: int, size: int) -> list[tuple[int, int]]:
    """Widen chunk-relative intervals to ``block`` boundaries (a copy may use another block size)."""
    out: list[list[int]] = []
    for a, b in intervals:
        a, b = a // block * block, min(size, -(-b // block) * block)
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class _Executor:
    def __init__(self, plan: LoadPlan, manifest: Manifest, reader: BlobReader, into: MutableMapping[str, Any]) -> None:
        self.plan, self.manifest, self.reader, self.into = plan, manifest, reader, into
        # the reader's optional capabilities, looked up once (see _readers): the reader, or None
        self.into_reader = reader if isinstance(reader, SupportsReadInto) else None
        self.pieces_reader = reader if isinstance(reader, SupportsReadPiecesInto) else None
        tuning = reader if isinstance(reader, ReadTuning) else None
        self.read_piece: int | None = tuning.read_piece if tuning is not None else None
        self.read_threads: int | None = tuning.read_threads if tuning is not None else None
        entry_bytes = sum(meta.byte_length for _, meta in plan.bytes_entries.values())
        self.report = LoadReport(needed_bytes=plan.needed_bytes + entry_bytes)
        self.lock = threading.Lock()
        self.op_reads: list[list[int]] = [[] for _ in plan.ops]
        for ri, r in enumerate(plan.reads):
            for i in r.ops:
                self.op_reads[i].append(ri)
        self.pending = [len(x) for x in self.op_reads]
        self.refs = [len(r.ops) for r in plan.reads]
        self.buffers: dict[int, Any] = {}  # read index -> its segments (None: the read failed)
        self.failed: dict[int, Exception] = {}
        self.pipeline: ReadStream | None = None  # the reader thread of a pipelined load (see run)
        self.after = [0] * len(plan.reads)  # bytes the plan reads after each read
        for ri in range(len(plan.reads) - 2, -1, -1):
            self.after[ri] = self.after[ri + 1] + plan.reads[ri + 1].byte_length

    # -- destinations -------------------------------------------------------------------
    def _dst(self, op: CopyOp) -> torch.Tensor:
        flat = self.into[op.fqn].view(-1)
        p = op.piece
        base = flat[p.base : p.base + math.prod(p.base_shape)].view(p.base_shape)
        return base[tuple(slice(o, o + n) for o, n in zip(op.dst_offsets, op.lengths))]

    def _src(self, op: CopyOp, data: torch.Tensor) -> torch.Tensor:
        """``data``: uint8 bytes of the chunk from ``op.span[0]`` to ``op.span[1]``."""
        dtype = dtype_from_name(op.dtype)
        return data.view(dtype).as_strided(op.lengths, _chunk_strides(op.chunk_lengths))

    def _direct_dst(self, i: int) -> torch.Tensor | None:
        """The destination bytes of op ``i`` when its whole chunk can be read straight into them."""
        op = self.plan.ops[i]
        c = op.copies[0].chunk
        if (not op.whole_chunk or len(self.op_reads[i]) != 1 or op.intervals != ((0, c.byte_length),)
                or self.into_reader is None):
            return None
        dst = self._dst(op)
        return dst.reshape(-1).view(torch.uint8) if dst.is_contiguous() else None

    def _segments(self, ri: int) -> list[Segment]:
        """Scatter list of read ``ri`` (see :data:`Segment`)."""
        r = self.plan.reads[ri]
        direct = []
        for i in r.ops:
            dst = self._direct_dst(i)
            if dst is not None:
                direct.append((self.plan.ops[i].copies[0].chunk.byte_offset, i, dst))
        direct.sort(key=lambda x: x[0])
        segs: list[Segment] = []
        cursor, end = r.byte_offset, r.byte_offset + r.byte_length
        for off, i, dst in direct:
            if off > cursor:
                segs.append((cursor, off, torch.empty(off - cursor, dtype=torch.uint8), None))
            segs.append((off, off + dst.numel(), dst, i))
            cursor = off + dst.numel()
        if cursor < end:
            segs.append((cursor, end, torch.empty(end - cursor, dtype=torch.uint8), None))
        return segs

    @staticmethod
    def _region(segs: Sequence[Segment], lo: int, hi: int) -> torch.Tensor | None:
        for a, b, buf, _ in segs:
            if a <= lo and hi <= b:
                return buf[lo - a : hi - a]
        return None

    # -- reads --------------------------------------------------------------------------
    def _pieces(self, ri: int, segs: Sequence[Segment], piece: int | None = None) -> list[tuple[int, list[memoryview]]]:
        """Read ``ri`` cut into ``(offset, scatter list)`` pieces of ``piece`` bytes (default: the reader's
        ``read_piece``; the whole read in one piece when it has none)."""
        r = self.plan.reads[ri]
        piece = piece or self.read_piece or r.byte_length
        end = r.byte_offset + r.byte_length
        arrays = [memoryview(seg[2].numpy()) for seg in segs]
        out = []
        pos, k = r.byte_offset, 0  # k: first segment not fully read
        while pos < end:
            stop = min(end, pos + piece)
            views = []
            while k < len(segs) and segs[k][0] < stop:
                sa, sb = segs[k][0], segs[k][1]
                views.append(arrays[k][max(pos, sa) - sa : min(stop, sb) - sa])
                if sb <= stop:
                    k += 1
                else:
                    break
            out.append((pos, views))
            pos = stop
        return out

    def _read_fused(self, ri: int, segs: Sequence[Segment], bad: dict[int, ChecksumError]) -> None:
        """Read ``ri`` in pieces of the reader's ``read_piece`` bytes (the filesystem: 1 MiB), verifying each
        piece's blocks right after it is read, while they are still in the CPU cache. A reader
        without ``read_piece`` (S3: one ranged GET per read) fills the whole read in one scatter
        read, then verifies."""
        r = self.plan.reads[ri]
        checks = ReadChecks(self.plan, ri, segs)
        pieces = self._pieces(ri, segs)
        if self.pieces_reader is not None:  # one open file for the read: the kernel's readahead follows it
            for stop in self.pieces_reader.read_pieces_into(self.plan.step, r.rank, pieces):
                checks.verify_upto(stop, bad)
            return
        assert self.into_reader is not None  # do_read reads fused only then
        for pos, views in pieces:
            self.into_reader.read_into(self.plan.step, r.rank, pos, views)
            checks.verify_upto(pos + sum(len(v) for v in views), bad)

    def _stream(self, ri: int) -> _Streamed:
        """Queue read ``ri`` on the reader thread (pipelined loads; see :meth:`run`).

        Returns ``(segments, checks, progress)``; see :class:`ReadStream` for ``progress``.
        """
        assert self.pipeline is not None
        segs = self._segments(ri)
        pieces = self._pieces(ri, segs, PIPELINE_PIECE[0])
        return segs, ReadChecks(self.plan, ri, segs), self.pipeline.submit(self.plan.reads[ri].rank, pieces,
                                                                            self.after[ri])

    def _verify_streamed(self, streamed: _Streamed, bad: dict[int, ChecksumError]) -> None:
        """Verify the pieces of a streamed read as the reader thread fills them; returns once it is
        done with the read's buffers, raising the read's error if it failed."""
        _, checks, progress = streamed
        err: BaseException | None = None
        while (item := progress.get()) is not None:
            if isinstance(item, BaseException):
                err = item
            elif err is None:
                checks.verify_upto(item, bad)
        if err is not None:
            raise err

    def do_read(self, ri: int, streamed: _Streamed | None = None) -> None:
        """Read ``ri`` (or wait for its ``streamed`` pieces), verify it, and finish every op it completes."""
        r = self.plan.reads[ri]
        step = self.plan.step
        segs: list[Segment] | None = None
        bad: dict[int, ChecksumError] = {}
        try:
            if streamed is not None:
                segs = streamed[0]
                self._verify_streamed(streamed, bad)
            elif self.into_reader is not None:
                segs = self._segments(ri)
                self._read_fused(ri, segs, bad)
            else:
                data = self.reader.read(step, r.rank, r.byte_offset, r.byte_length)
                if len(data) != r.byte_length:
                    raise StorageError(f"short read of rank {r.rank}'s blob: {len(data)} of {r.byte_length} bytes",
                                       rank=r.rank, step=step)
                segs = [(r.byte_offset, r.byte_offset + r.byte_length, _u8(data), None)]
                ReadChecks(self.plan, ri, segs).verify_upto(r.byte_offset + r.byte_length, bad)
            err = None
        except StorageError as e:  # the read itself failed: every op of it needs another copy
            segs, err = None, e
        ready = []
        with self.lock:
            self.report.read_bytes += r.byte_length
            self.report.reads += 1
            self.buffers[ri] = segs
            for i in r.ops:
                if err is not None or i in bad:
                    self.failed.setdefault(i, err if err is not None else bad[i])
                self.pending[i] -= 1
                if self.pending[i] == 0:
                    ready.append(i)
        direct = {seg[3] for seg in segs or () if seg[3] is not None}
        for i in ready:
            try:
                if i in self.failed:
                    self._fallback(i)
                elif i not in direct:
                    self._copy(i)
            finally:
                with self.lock:
                    for rj in self.op_reads[i]:
                        self.refs[rj] -= 1
                        if self.refs[rj] == 0:
                            self.buffers.pop(rj, None)

    def _copy(self, i: int) -> None:
        op = self.plan.ops[i]
        base = op.copies[0].chunk.byte_offset
        first, end = base + op.span[0], base + op.span[1]
        reads = self.op_reads[i]
        data = self._region(self.buffers[reads[0]], first, end) if len(reads) == 1 else None
        if data is None:
            data = torch.empty(end - first, dtype=torch.uint8)
            for ri in reads:
                for a, b, buf, _ in self.buffers[ri]:
                    lo, hi = max(first, a), min(end, b)
                    if lo < hi:
                        data[lo - first : hi - first] = buf[lo - a : hi - a]
        copy_into(self._dst(op), self._src(op, data))

    def _fallback(self, i: int) -> None:
        op = self.plan.ops[i]
        first_err = self.failed[i]
        for ref in op.copies[1:]:
            try:
                c = ref.chunk
                staging = torch.empty(op.span[1] - op.span[0], dtype=torch.uint8)
                for a, b in _widen(op.intervals, c.block_size, c.byte_length):
                    raw = self.reader.read(self.plan.step, ref.rank, c.byte_offset + a, b - a)
                    with self.lock:
                        self.report.read_bytes += b - a
                        self.report.reads += 1
                    mv = memoryview(raw)
                    c.verify(mv, a, name=op.fqn, rank=ref.rank)
                    lo, hi = max(a, op.span[0]), min(b, op.span[1])
                    if lo < hi:
                        staging[lo - op.span[0] : hi - op.span[0]] = _u8(mv)[lo - a : hi - a]
                copy_into(self._dst(op), self._src(op, staging))
                with self.lock:
                    self.report.fallbacks.append(
                        f"{op.fqn}@{list(op.copies[0].chunk.offsets)}: rank {op.copies[0].rank} failed "
                        f"({first_err.message}); used rank {ref.rank}")
                return
            except (ChecksumError, StorageError):
                continue
        raise first_err

    def run(self, threads: int, pipelined: bool | None = None) -> LoadReport:
        """Execute the plan on ``threads`` threads (at most the reader's ``read_threads``).

        Pipelined when the reader streams one sequential read at a time (``read_threads`` 1,
        ``read_piece`` and ``read_pieces_into``: the filesystem) and ``pipelined`` (default: a
        second CPU is there): a :class:`ReadStream` thread reads the plan's reads in order, in
        large calls on one open file, while this thread verifies the pieces already read and
        copies finished chunks. Reads are queued :data:`PIPELINE_AHEAD` bytes ahead of the one
        being verified, so the stream does not wait for the verifier. The load then takes
        about as long as the read alone instead of read + checksum.
        """
        errors: list[BaseException] = []
        threads = min(threads, self.read_threads or threads)
        streamer = self.pieces_reader if threads <= 1 and self.read_piece else None  # streams one read at a time
        if pipelined is None:
            pipelined = len(os.sched_getaffinity(0)) > 1
        if streamer is not None and pipelined:
            self.pipeline = ReadStream(streamer, self.plan.step, pipeline_piece)
        try:
            return self._run(threads, errors)
        finally:
            if self.pipeline is not None:  # waits for a queued read: nothing is written after the load
                self.pipeline.close()

    def _run(self, threads: int, errors: list[BaseException]) -> LoadReport:
        n = len(self.plan.reads)
        if self.pipeline is not None:
            queued: deque[_Streamed] = deque()
            nxt = ahead = 0
            for ri in range(n):
                while nxt < n and (nxt <= ri or ahead < PIPELINE_AHEAD):
                    queued.append(self._stream(nxt))
                    ahead += self.plan.reads[nxt].byte_length
                    nxt += 1
                ahead -= self.plan.reads[ri].byte_length
                self.do_read(ri, queued.popleft())
        elif threads <= 1 or n <= 1:
            for ri in range(len(self.plan.reads)):
                self.do_read(ri)
        else:
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lifeline-load") as pool:
                futures = [pool.submit(self.do_read, ri) for ri in range(len(self.plan.reads))]
                for f in futures:
                    e = f.exception()
                    if e is not None:
                        errors.append(e)
            if errors:
                raise errors[0]
        for key, (rank, meta) in self.plan.bytes_entries.items():
            data = self.reader.read(self.plan.step, rank, meta.byte_offset, meta.byte_length) if meta.byte_length else b""
            self.report.read_bytes += meta.byte_length
            meta.verify(memoryview(data), rank=rank)
            self.into[key] = bytes(data)
        return self.report


def execute_load(plan: LoadPlan, manifest: Manifest, reader: BlobReader, into: MutableMapping[str, Any],
                 *, threads: int = 4, pipelined: bool | None = None) -> LoadReport:
    """Run ``plan``: fill the tensors of ``into`` in place and set its byte entries.

    Reads run on ``threads`` threads (at most the reader's ``read_threads``: one for the filesystem,
    whose reads stream fastest in order, each verified piece by piece as it arrives). A reader
    that streams (the filesystem) is read by a thread of its own while this one verifies
    (``pipelined``; default: when this process may run on more than one CPU). A chunk
    whose primary copy fails verification or cannot be read is read from the next copy; when
    none is left the first error (:class:`ChecksumError` or :class:`StorageError`, naming the
    tensor and chunk) is raised and ``into`` may be partly written.
    """
    return _Executor(plan, manifest, reader, into).run(threads, pipelined)
