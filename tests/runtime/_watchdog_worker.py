"""One rank of the watchdog test (``python _watchdog_worker.py OP...``), configured by LIFELINE_* variables.

For the i-th OP, in generation i: rank 0, the survivor, posts OP (``recv`` from rank 1, or
``all_reduce`` / ``all_to_all`` on a sub-group built under ``ctx.watching()`` as a trainer's
``connect`` is) and waits on it; rank 1, a re-planned peer, stays alive with its connections open,
never takes part, and has no watchdog of its own (a frozen peer: only rank 0's watchdog can end
rank 0's wait). Once rank 0 left the op it says so on a Redis list; both then join the generation
of the plan the test published and all-reduce ``rank + 1`` there.

Events (JSON lines, each with ``generation``): ``blocked`` (the op is posted), ``idle`` (rank 1),
``left`` (``seconds`` waited, ``error``, ``intact``: the state and the op's buffer unchanged),
``rejoined`` (``sum``).
"""

import contextlib
import json
import sys
import time

import redis
import torch
import torch.distributed as dist

from lifeline.runtime import init


def say(event: str, **fields) -> None:
    print(json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def block(ctx, op: str, sub) -> None:
    """Rank 0: post ``op`` with rank 1 (which never takes part) and wait until it fails."""
    state = {"w": torch.arange(4096, dtype=torch.float32), "m": torch.randn(64, 64)}
    kept = {k: v.clone() for k, v in state.items()}
    buf = torch.full((8,), 7.0)
    out = torch.full((8,), -1.0)
    if op == "recv":
        work = dist.irecv(buf, src=1)
    elif op == "all_reduce":
        work = dist.all_reduce(buf, group=sub, async_op=True)
    elif op == "all_to_all":
        work = dist.all_to_all_single(out, buf, group=sub, async_op=True)
    else:
        raise SystemExit(f"unknown op {op}")
    say("blocked", op=op, generation=ctx.generation)
    start = time.monotonic()
    try:
        work.wait()
        error = None
    except Exception as err:  # noqa: BLE001 - reported
        error = f"{type(err).__name__}: {err}"[:300]
    intact = all(torch.equal(state[k], kept[k]) for k in state) and torch.equal(buf, torch.full((8,), 7.0))
    say("left", generation=ctx.generation, seconds=round(time.monotonic() - start, 4), error=error, intact=intact)


def main(ops: list[str]) -> None:
    ctx = init()
    r = redis.Redis.from_url(ctx.settings.redis_url)
    left_key = f"lifeline-test:{ctx.job}:left"
    watching = getattr(ctx, "watching", contextlib.nullcontext)
    if ctx.rank == 1 and getattr(ctx, "watchdog", None) is not None:
        ctx.watchdog.close()
    try:
        for op in ops:
            with watching():  # as run_training wraps trainer.connect
                sub = dist.new_group([0, 1], timeout=ctx.collective_timeout)
            if ctx.rank == 1:
                say("idle", generation=ctx.generation)
                deadline = time.monotonic() + 120  # short BLPOPs: a client's read timeout must not end the wait
                while r.blpop([left_key], timeout=1) is None:
                    assert time.monotonic() < deadline, "rank 0 never left its collective"
            else:
                block(ctx, op, sub)
                r.rpush(left_key, "1")
            del sub
            plan = ctx.wait_for_plan()
            ctx.rejoin(plan.generation)
            t = torch.tensor([float(ctx.rank + 1)])
            dist.all_reduce(t)
            say("rejoined", generation=ctx.generation, sum=t.item())
        dist.barrier()
    finally:
        ctx.close()


if __name__ == "__main__":
    main(sys.argv[1:])
