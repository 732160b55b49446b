"""Verifying a load's reads as their bytes arrive: each checksum block once, while it is cache-hot."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lifeline.checkpoint._load_plan import LoadPlan
from lifeline.errors import ChecksumError

__all__ = ["Segment", "ReadChecks"]

Segment = tuple[int, int, torch.Tensor, int | None]
"""One buffer of a read's scatter list: ``(abs_start, abs_end, uint8 buffer, direct op or None)``:
blob bytes ``[abs_start, abs_end)`` land in the buffer, which is the destination of op ``direct``
itself when the op's whole chunk is read straight into its tensor."""


class ReadChecks:
    """The block-aligned ranges of read ``ri`` of ``plan`` to verify, and how far each is verified.

    Each distinct interval of the primary copies the read serves is checked once, every op
    reading it sharing the outcome, in the one segment of ``segs`` it lies inside (an interval
    of another read is that read's to check). Call :meth:`verify_upto` as the read's bytes
    arrive, in blob order.
    """

    def __init__(self, plan: LoadPlan, ri: int, segs: Sequence[Segment]) -> None:
        self.plan = plan
        # per range: [abs_lo, abs_hi, ops, ref, buf, seg_start, cursor] (lists: updated in place)
        by_range: dict[tuple[int, int], list[Any]] = {}
        for i in plan.reads[ri].ops:
            op = plan.ops[i]
            ref = op.copies[0]
            c = ref.chunk
            for a, b in op.intervals:
                lo, hi = c.byte_offset + a, c.byte_offset + b
                chk = by_range.get((lo, hi))
                if chk is not None:
                    chk[2].append(i)
                    continue
                for sa, sb, buf, _ in segs:
                    if sa <= lo and hi <= sb:
                        by_range[(lo, hi)] = [lo, hi, [i], ref, memoryview(buf.numpy()), sa, lo]
                        break
        self._checks = sorted(by_range.values(), key=lambda x: x[0])

    def verify_upto(self, upto: int, bad: dict[int, ChecksumError]) -> None:
        """Verify every whole checksum block below blob byte ``upto`` not verified yet (the bytes were
        just read, so they are still in the CPU cache). A mismatch puts every op reading that
        range in ``bad`` (op index -> the first :class:`ChecksumError`)."""
        checks = self._checks
        while checks and checks[0][6] >= checks[0][1]:  # sorted by start: drop the finished head
            checks.pop(0)
        for chk in checks:
            lo, hi, ops, ref, buf, sa, cursor = chk
            if lo >= upto:
                break
            if cursor >= hi:
                continue
            c = ref.chunk
            end = hi if upto >= hi else lo + (upto - lo) // c.block_size * c.block_size
            if end <= cursor:
                continue
            chk[6] = end
            try:
                c.verify(buf[cursor - sa : end - sa], cursor - c.byte_offset,
                         name=self.plan.ops[ops[0]].fqn, rank=ref.rank)
            except ChecksumError as e:
                chk[6] = hi
                for i in ops:
                    bad.setdefault(i, e)
