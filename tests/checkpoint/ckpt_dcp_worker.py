"""Worker for the DCP interop test: two gloo ranks save a DTensor-sharded state with torch.distributed.checkpoint."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def full_state() -> dict:
    g = torch.Generator().manual_seed(42)
    return {"w": torch.randn(10, 6, generator=g), "b": torch.randn(6, generator=g),
            "e": torch.randn(4, 9, generator=g).to(torch.bfloat16)}


if __name__ == "__main__":
    rank, world, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = full_state()
    state = {
        "w": distribute_tensor(full["w"], mesh, [Shard(0)]),
        "b": distribute_tensor(full["b"], mesh, [Replicate()]),
        "e": distribute_tensor(full["e"], mesh, [Shard(1)]),
    }
    dcp.save(state, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()
