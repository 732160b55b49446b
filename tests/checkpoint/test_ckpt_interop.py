"""DCP and safetensors interop: ours -> DCP -> torch.distributed.checkpoint.load; a real DCP checkpoint imports and reshards."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckpt_dcp_worker import full_state
from ckpt_models import assert_states_equal, build_model, states_for
from safetensors.torch import load_file

from lifeline.checkpoint import FilesystemStorage, Layout, PatternRules, Sharded, load, save_states, shard_state
from lifeline.checkpoint.interop import export_dcp, export_safetensors, import_dcp

HERE = Path(__file__).parent


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_ours_to_dcp_loads_the_same_tensors(tmp_path):
    model = build_model(5, 2, 2, 3, 17, 2, torch.bfloat16)
    layout = Layout(tensor=2, data=2, expert=2)
    storage = FilesystemStorage(tmp_path / "ours", fsync=False)
    states = states_for(model, layout)
    for r, s in enumerate(states):
        s["loader"] = f"pos-{r}".encode()
    save_states(storage, "x", "job", 3, layout, model.rules, states)
    names = export_dcp(storage, "x", "job", 3, tmp_path / "dcp")
    assert "loader" in names
    back = {k: torch.zeros_like(v) for k, v in model.full.items()}
    back["loader"] = io.BytesIO()
    dcp.load(back, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert back.pop("loader").getvalue() == b"pos-0"
    assert_states_equal(back, model.full)

    export_safetensors(storage, "x", "job", 3, tmp_path / "m.safetensors")
    assert_states_equal(load_file(str(tmp_path / "m.safetensors")), model.full)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_sharded_dcp_checkpoint_imports_and_reshards(tmp_path):
    path = tmp_path / "dcp"
    port = str(_free_port())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(HERE / "ckpt_dcp_worker.py"), str(r), "2", port, str(path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
    storage = FilesystemStorage(tmp_path / "ours", fsync=False)
    manifest = import_dcp(path, storage, "imp", "job", 9)
    full = full_state()
    assert sorted(manifest.tensors) == sorted(full)
    rules = PatternRules([("w", Sharded(0))])  # "e" was sharded unevenly (5+4 columns) by DCP; here replicated
    target = Layout(tensor=2, data=2)
    for r in range(target.world_size):
        want = shard_state(full, target, r, rules)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        load(storage, "imp", "job", 9, target, r, rules, into)
        assert_states_equal(into, want)


def _spy_loader(full: dict[str, torch.Tensor]):
    """A ``load`` for import_streamed that hands out copies and counts how many are alive at once."""
    import weakref

    alive, peak = [0], [0]

    def load(name: str) -> torch.Tensor:
        t = full[name].clone()
        alive[0] += 1
        peak[0] = max(peak[0], alive[0])
        weakref.finalize(t, lambda: alive.__setitem__(0, alive[0] - 1))
        return t

    return load, peak


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
def test_a_streamed_import_holds_a_few_tensors_at_a_time_and_loads_into_any_layout(tmp_path, backend, request):
    from lifeline.checkpoint import S3Storage, consolidate
    from lifeline.checkpoint import load as ckpt_load
    from lifeline.checkpoint._import_stream import TensorSpec, import_streamed

    if backend == "s3":
        minio = request.getfixturevalue("minio_server")
        storage = S3Storage(minio.endpoint, minio.access_key, minio.secret_key, "streamed", part_size=5 << 20)
    else:
        storage = FilesystemStorage(tmp_path / "store", fsync=False)
    g = torch.Generator().manual_seed(3)
    full = {f"layer.{i}.w": torch.randn(256, 512, generator=g) for i in range(24)}  # 512 KiB each
    full["emb"] = torch.randn(320, 64, generator=g).to(torch.bfloat16)
    entries = {k: TensorSpec(tuple(v.shape), v.dtype) for k, v in full.items()}
    entries["data.position"] = b'{"step": 7}'
    load, peak = _spy_loader(full)
    manifest = import_streamed(storage, "ck", "st", 7, entries, load)
    assert peak[0] <= 6, f"{peak[0]} of {len(full)} source tensors were alive at once"  # the writer's queue, not all
    assert sorted(manifest.tensors) == sorted(full)
    whole = consolidate(storage, "ck", "st", 7)
    assert all(torch.equal(whole[k], full[k]) for k in full)
    rules = PatternRules([("layer.*", Sharded(1)), ("emb", Sharded(0))])
    for layout in (Layout(tensor=2), Layout(tensor=4)):  # the replicated import reshards into any layout
        for rank in range(layout.world_size):
            into = shard_state({k: torch.zeros_like(v) for k, v in full.items()}, layout, rank, rules)
            ckpt_load(storage, "ck", "st", 7, layout, rank, rules, into)
            expect = shard_state(full, layout, rank, rules)
            assert all(torch.equal(into[k], expect[k]) for k in expect)


def test_a_streamed_import_that_reads_a_wrong_tensor_commits_nothing(tmp_path):
    from lifeline.checkpoint import list_steps
    from lifeline.checkpoint._import_stream import TensorSpec, import_streamed
    from lifeline.errors import LayoutError

    storage = FilesystemStorage(tmp_path / "store", fsync=False)
    entries = {"a": TensorSpec((4, 4), torch.float32), "b": TensorSpec((8,), torch.float32)}
    with pytest.raises(LayoutError, match="'b' read as"):
        import_streamed(storage, "ck", "bad", 1, entries, lambda name: torch.zeros(4, 4) if name == "a" else torch.zeros(9))
    assert list_steps(storage, "ck", "bad") == [] and not list((tmp_path / "store").rglob("rank-0.bin"))
