"""The reshard bench's state and its saving ranks: each rank of the old layout hands its shard to its own
``lifeline sidecar`` (which replicates it to a peer, L1, and persists it to MinIO, L2) and saves the same
shard with torch.distributed.checkpoint (DTensor ``Shard(0)`` on the old mesh) to the same MinIO.

Run as ``python -m lifeline.bench._reshard_source CONFIG_JSON`` for one saving rank.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from dataclasses import asdict, dataclass

import torch

from lifeline.checkpoint import Layout, PatternRules, Sharded

__all__ = ["StateSpec", "RULES", "layout_of", "shard", "source_rank"]

RULES = PatternRules([("*", Sharded(0))])
"""Every tensor is split on dim 0 across the tensor-parallel ranks (column-parallel weights, as
Megatron-LM's QKV and MLP up projections)."""

COLS = 1024


@dataclass(frozen=True)
class StateSpec:
    """The logical state: ``tensors`` float32 tensors of shape ``[rows, 1024]``, about ``total`` bytes.

    Each tensor is ``blocks`` row blocks (``blocks`` = the least common multiple of the tensor
    degrees of the run, so any of them takes whole blocks), each block drawn from its own seeded
    generator: a rank computes its shard without the rest of the state.
    """

    total: int
    tensors: int
    blocks: int
    seed: int = 0

    @property
    def rows(self) -> int:
        """Rows per tensor: a multiple of ``blocks`` (and of 8)."""
        step = math.lcm(self.blocks, 8)
        return max(step, self.total // self.tensors // (COLS * 4) // step * step)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole state."""
        return self.tensors * self.rows * COLS * 4

    def to_json(self) -> dict:
        return asdict(self)


def layout_of(degree: int) -> Layout:
    """The layout of a tensor-parallel degree (pipeline, data and expert 1)."""
    return Layout(tensor=degree)


def shard(spec: StateSpec, degree: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s part of every tensor when the tensor degree is ``degree``: rows
    ``[rank * rows / degree, (rank + 1) * rows / degree)``, float32 ``[rows / degree, 1024]``."""
    per_block = spec.rows // spec.blocks
    mine = range(rank * spec.blocks // degree, (rank + 1) * spec.blocks // degree)
    out = {}
    for i in range(spec.tensors):
        t = torch.empty(len(mine) * per_block, COLS)
        for j, b in enumerate(mine):
            g = torch.Generator().manual_seed((spec.seed * 1_000_003 + i) * 4099 + b)
            torch.randn(per_block, COLS, generator=g, out=t[j * per_block:(j + 1) * per_block])
        out[f"layers.{i}.weight"] = t
    return out


def join_group(cfg: dict) -> tuple[int, int]:
    """A bench rank's start (saving or loading): one thread, DCP's S3 backend registered for the
    bench's MinIO (``cfg["minio"]``), the gloo group of ``cfg["world"]`` ranks on loopback port
    ``cfg["port"]``. Returns ``(rank, world size)``."""
    import torch.distributed as dist

    from lifeline.bench._dcp_s3 import register

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    register(*cfg["minio"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=cfg["rank"],
                            world_size=cfg["world"])
    return cfg["rank"], cfg["world"]


def source_rank(cfg: dict) -> None:
    """One rank of the old layout: DCP save of its DTensor shard to MinIO, then its sidecar save.

    ``cfg``: ``rank``, ``world`` (the old tensor degree), ``port`` (gloo), ``spec`` (a
    :class:`StateSpec` as JSON), ``step``, ``dcp`` (an ``lminio://`` path), ``minio`` (endpoint,
    access and secret key), ``settings`` (the rank's :class:`~lifeline.api.pod.TrainerSettings` as JSON).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from lifeline.api.pod import TrainerSettings
    from lifeline.checkpoint import plan_shard
    from lifeline.sidecar.client import SidecarClient

    rank, world = join_group(cfg)
    try:
        local = shard(StateSpec(**cfg["spec"]), world, rank)
        mesh = init_device_mesh("cpu", (world,))
        dt = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in local.items()}
        dcp.save(dt, storage_writer=dcp.FsspecWriter(cfg["dcp"], sync_files=False))
        del dt
        plan = plan_shard(local, layout_of(world), rank, RULES)
        with SidecarClient(TrainerSettings(**cfg["settings"])) as client:
            client.save(cfg["step"], local, plan)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    source_rank(json.loads(sys.argv[1]))
