"""DTensor (FSDP2) state in the universal format: the ``placed`` pattern's boxes, a save at world size 1
read back at 3 (in this process), and a real ``fully_shard`` job saved at world size 4 and reloaded
at 2 over gloo (forked ranks), bit-identical to what was saved (DESIGN.md invariant 2)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from lifeline.checkpoint import Layout, Placed, RankCoords, consolidate, load, storage_from_uri
from lifeline.checkpoint._patterns import pattern_from_dict, pattern_to_dict
from lifeline.errors import CheckpointError, ConfigError, LayoutError
from lifeline.runtime import StatefulState, StorageCheckpointer

WORKER = Path(__file__).with_name("_dtensor_worker.py")


@pytest.mark.parametrize("shape", [(5, 3), (3,), (8, 6), (1, 4), (0, 2)])
@pytest.mark.parametrize("mesh", [(4,), (3,), (2, 2), (2, 3)])
def test_the_placed_box_is_the_dtensor_local_shard_torch_computes(shape, mesh):
    axes = ("data", "tensor")[: len(mesh)]
    options = [Replicate()] + [Shard(d) for d in range(len(shape))]
    for placements in itertools.product(options, repeat=len(mesh)):
        shards = tuple(p.dim if isinstance(p, Shard) else None for p in placements)
        pattern = Placed(shape, axes, shards)
        layout = Layout(**dict(zip(axes, mesh)))
        for coord in itertools.product(*(range(n) for n in mesh)):
            coords = RankCoords(**dict(zip(axes, coord)))
            local, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), placements)
            offsets, lengths = pattern.box(layout, coords)
            assert lengths == tuple(local), (shape, mesh, placements, coord)
            if 0 not in lengths:  # torch's offset of an empty shard is the dim's end, ours its clamp: unread
                assert offsets == tuple(offset), (shape, mesh, placements, coord)


def test_a_placed_pattern_round_trips_as_json_and_checks_the_local_shape():
    pattern = Placed((5, 6), ("data",), (0,))
    assert pattern_to_dict(pattern) == {"kind": "placed", "shape": [5, 6], "axes": ["data"], "shards": [0]}
    assert pattern_from_dict(pattern_to_dict(pattern)) == pattern
    layout = Layout(data=4)
    assert pattern.pieces((0, 6), layout, layout.coords(3)) == []  # 5 rows over 4 ranks: 2, 2, 1, 0
    with pytest.raises(LayoutError, match="local shard of shape"):
        pattern.pieces((2, 6), layout, layout.coords(2))
    with pytest.raises(LayoutError, match="mesh axis"):
        Placed((4,), ("rows",), (0,))


@pytest.fixture
def world_of_one(tmp_path):
    """A one-rank gloo group in this process (a file store: no port)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_fully_sharded_state_saved_at_one_rank_loads_as_any_ranks_box(world_of_one, tmp_path):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = fully_shard(nn.Linear(4, 7))
    state = StatefulState({"model": model}, rng=False)
    values = state.values(1)
    assert isinstance(model.weight, DTensor) and state.sharded
    assert state.rules.match("model.weight") == Placed((7, 4), ("data",), (0,))
    storage, prefix = storage_from_uri(str(tmp_path / "l2"))
    StorageCheckpointer(storage, prefix, "one", Layout(), 0, state.rules).save(1, values)
    whole = consolidate(storage, prefix, "one", 1)
    assert torch.equal(whole["model.weight"], model.weight.full_tensor())
    layout = Layout(data=3)  # 7 rows over 3 ranks: 3, 3, 1
    for rank, rows in enumerate([(0, 3), (3, 6), (6, 7)]):
        into = {"model.weight": torch.empty(rows[1] - rows[0], 4), "model.bias": torch.empty(rows[1] - rows[0])}
        load(storage, prefix, "one", 1, layout, rank, state.rules, into)
        assert torch.equal(into["model.weight"], whole["model.weight"][rows[0]:rows[1]])
        assert torch.equal(into["model.bias"], whole["model.bias"][rows[0]:rows[1]])
    with torch.no_grad():  # a load wraps the shard on the live mesh and hands it to the module
        model.weight.to_local().zero_()
    loaded = dict(values)
    loaded["model.weight"] = whole["model.weight"].clone()
    state.load(loaded)
    assert torch.equal(model.weight.full_tensor(), whole["model.weight"])
    loaded["model.weight"] = whole["model.weight"][:3].clone()  # a shard of another layout's box
    with pytest.raises(CheckpointError, match="does not fit the live shard"):
        state.load(loaded)


def test_a_dtensor_on_an_unnamed_two_dimensional_mesh_or_with_a_partial_placement_is_refused(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, distribute_tensor

    mesh = init_device_mesh("cpu", (1, 1))
    t = distribute_tensor(torch.ones(2, 2), mesh, [Shard(0), Replicate()])
    with pytest.raises(ConfigError, match="unnamed 2-D"):
        StatefulState({"m": _Holder(t)}, rng=False).values(0)
    partial = DTensor.from_local(torch.ones(2), init_device_mesh("cpu", (1,)), [Partial()])
    with pytest.raises(ConfigError, match="only Shard"):
        StatefulState({"m": _Holder(partial)}, rng=False).values(0)


class _Holder:
    def __init__(self, t):
        self.t = t

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, sd):
        self.t = sd["t"]


def _ranks(mode: str, world: int, root: Path) -> None:
    """``world`` ranks of ``_dtensor_worker.main`` (forked: no interpreter start per rank)."""
    mp.start_processes(_rank, args=(mode, world, str(root)), nprocs=world, start_method="fork")


def _rank(rank: int, mode: str, world: int, root: str) -> None:
    spec = importlib.util.spec_from_file_location("dtensor_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.main(mode, rank, world, f"file://{root}/store-{mode}", root)


@pytest.mark.slow
def test_an_fsdp2_job_saved_at_world_size_4_reloads_at_2_bit_identically(tmp_path):
    _ranks("save", 4, tmp_path)
    _ranks("load", 2, tmp_path)
    saved, loaded = torch.load(tmp_path / "save-4.pt"), torch.load(tmp_path / "load-2.pt")
    names = sorted(k for k in saved)
    assert "app.model.0.weight" in names and "app.optim.state.0.weight.exp_avg" in names, names
    for name in names:  # parameters and Adam moments, gathered whole: equal bit for bit
        assert torch.equal(saved[name], loaded[name]), name
    assert not torch.equal(loaded["next.app.model.0.weight"], loaded["app.model.0.weight"])  # it trains on
