"""One rank of an FSDP2 (``fully_shard``) job over gloo on CPU, for tests/runtime/test_dtensor_state.py.

``save`` trains a tiny model two steps at its world size and saves ``StatefulState`` of
``{"app": AppState}`` (``get_state_dict``: DTensor shards) through a ``StorageCheckpointer`` into the
universal format; rank 0 also writes the full tensors (``full_tensor()``) it expects a reload to give.
``load`` builds the model afresh (other seed) at its own world size, restores that step resharded,
trains one more step and writes the full tensors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from lifeline.checkpoint import Layout, storage_from_uri
from lifeline.runtime import StatefulState, StorageCheckpointer


class AppState:
    """The DCP recipe's ``Stateful``: model and optimizer through ``get_state_dict``/``set_state_dict``."""

    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """5 and 3 output rows: uneven shards at world size 4 (2, 2, 1, 0 rows), empty ones included."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model: nn.Module, optim: torch.optim.Optimizer, i: int, rank: int, world: int) -> None:
    """Global batch of 8 rows for step ``i``, this rank's ``8 / world`` of them."""
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 + i))
    per = 8 // world
    model(x[rank * per:(rank + 1) * per]).pow(2).mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def full(app: AppState) -> dict[str, torch.Tensor]:
    """Every tensor of the state, DTensors gathered whole (a collective)."""
    out = {}
    values = app.state_dict()

    def walk(node, path):
        if isinstance(node, torch.Tensor):
            out[path] = (node.full_tensor() if isinstance(node, DTensor) else node).detach().clone()
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
    walk(values, "app")
    return out


def main(mode: str, rank: int, world: int, init_method: str, root: str) -> None:
    """Rank ``rank`` of ``world``: ``mode`` is ``save`` or ``load`` (module docstring); the group
    rendezvous at ``init_method`` (``file://...``), the checkpoint and expected tensors under ``root``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    storage, prefix = storage_from_uri(str(Path(root) / "l2"))
    layout = Layout(data=world)
    if mode == "save":
        model, optim = build(0)
        for i in range(2):
            step(model, optim, i, rank, world)
        app = AppState(model, optim)
        state = StatefulState({"app": app}, rng=False)
        values = state.values(2)
        assert state.sharded and isinstance(state.rules.match("app.model.0.weight").shape, tuple)
        StorageCheckpointer(storage, prefix, "dt", layout, rank, state.rules).save(2, values)
        expected = full(app)
    else:
        model, optim = build(1)
        app = AppState(model, optim)
        state = StatefulState({"app": app}, rng=False)
        checkpointer = StorageCheckpointer(storage, prefix, "dt", layout, rank, state.rules)
        assert state.load(checkpointer.restore(2, into=state.template(2))) == 2
        expected = full(app)
        step(model, optim, 2, rank, world)
        expected.update({f"next.{k}": v for k, v in full(app).items()})
    if rank == 0:
        torch.save(expected, Path(root) / f"{mode}-{world}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
