"""The trainer's one memcpy into the arena, split over a few threads.

A copy of hundreds of MiB is bound by memory bandwidth, which one core rarely saturates: two
threads copying disjoint tensors finish sooner (numpy's copy releases the GIL). The tensors are
split into groups of about equal bytes (longest-processing-time first) and each group is written
by ``lifeline.checkpoint.write_shard`` on a sub-plan that lists only its tensors, so byte
positions, validation and errors are exactly the library's.
"""

from __future__ import annotations

import dataclasses
import heapq
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lifeline.checkpoint import write_shard

MIN_PARALLEL_BYTES = 16 << 20  # below this a second thread costs more than it saves


def write_parallel(plan: Any, state: Any, out: memoryview, pool: ThreadPoolExecutor | None, threads: int) -> None:
    """``write_shard(plan, state, out)`` with the tensors split over ``threads`` threads.

    Args:
        plan: the ``ShardPlan``.
        state: fqn → tensor / bytes entry, matching ``plan``.
        out: the destination (an arena slot view of at least ``plan.nbytes`` bytes).
        pool: threads for every group but the first (which runs in the caller); None: one thread.
        threads: the number of groups (1: a plain ``write_shard``).

    Raises:
        LayoutError: ``state`` does not match ``plan`` (raised only after every thread has stopped
            writing into ``out``).
    """
    if pool is None or threads <= 1 or len(plan.tensors) < 2 or plan.nbytes < MIN_PARALLEL_BYTES:
        write_shard(plan, state, out)
        return
    groups = _balance(plan.tensors, threads)
    subs = [dataclasses.replace(plan, tensors=tuple(g), bytes_entries=plan.bytes_entries if i == 0 else ())
            for i, g in enumerate(groups) if g or i == 0]
    futs = [pool.submit(write_shard, sp, state, out) for sp in subs[1:]]
    first: BaseException | None = None
    try:
        write_shard(subs[0], state, out)
    except BaseException as err:  # wait for the other threads before the caller gives the slot back
        first = err
    for f in futs:
        try:
            f.result()
        except BaseException as err:
            first = first or err
    if first is not None:
        raise first


def _balance(tensors: tuple, k: int) -> list[list]:
    """Split tensor plans into ``k`` groups of about equal bytes (largest first onto the lightest group),
    each group in plan order."""
    size = {id(t): sum(c.byte_length for c in t.chunks) for t in tensors}
    heap = [(0, i) for i in range(k)]
    groups: list[list] = [[] for _ in range(k)]
    for t in sorted(tensors, key=lambda t: -size[id(t)]):
        load, i = heapq.heappop(heap)
        groups[i].append(t)
        heapq.heappush(heap, (load + size[id(t)], i))
    order = {id(t): n for n, t in enumerate(tensors)}
    return [sorted(g, key=lambda t: order[id(t)]) for g in groups]
