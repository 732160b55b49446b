"""One rank of the rendezvous test: ``init()`` from LIFELINE_* variables, one all_reduce, one JSON line."""

import json

import torch
import torch.distributed as dist

from lifeline.runtime import init


def main() -> None:
    ctx = init()
    try:
        t = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(t)
        print(json.dumps({"rank": ctx.rank, "sum": t.item(), "generation": ctx.generation,
                          "world": dist.get_world_size()}), flush=True)
        dist.barrier()
    finally:
        ctx.close()


if __name__ == "__main__":
    main()
