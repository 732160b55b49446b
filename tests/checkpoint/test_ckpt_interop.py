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
