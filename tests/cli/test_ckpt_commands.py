"""``lifeline ckpt import | rm | gc | export | show`` on real checkpoint directories."""

from __future__ import annotations

import os
import stat

import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from lifeline.checkpoint import (FilesystemStorage, Layout, PatternRules, Sharded, blob_key, list_steps, load,
                                 read_manifest, save_states)
from lifeline.cli import app
from lifeline.errors import ChecksumError, ConfigError, StorageError

runner = CliRunner()
FULL = {"w": torch.arange(24, dtype=torch.float32).reshape(4, 6), "b": torch.linspace(0, 1, 6)}
RULES = PatternRules([("w", Sharded(0))])


def _store(root, steps=(4, 8)):
    storage = FilesystemStorage(root, fsync=False)
    for step in steps:
        states = [{"w": FULL["w"][2 * r:2 * r + 2].clone(), "b": FULL["b"].clone()} for r in range(2)]
        save_states(storage, "", "gpt", step, Layout(tensor=2), RULES, states)
    return storage


def _invoke(*args):
    return runner.invoke(app, list(args), terminal_width=200)


def test_import_safetensors_loads_into_two_layouts(tmp_path):
    src = tmp_path / "full.safetensors"
    save_file(FULL, str(src))
    root = tmp_path / "store"
    res = _invoke("ckpt", "import", str(src), str(root), "--job", "imp", "--step", "3")
    assert res.exit_code == 0, res.output
    storage = FilesystemStorage(root, fsync=False)
    assert list_steps(storage, "", "imp") == [3]
    assert read_manifest(storage, "", "imp", 3).tensors["w"].pattern["kind"] == "replicated"
    for layout in (Layout(), Layout(tensor=2)):
        for rank in range(layout.world_size):
            rows = 4 // layout.tensor
            into = {"w": torch.empty(rows, 6), "b": torch.empty(6)}
            load(storage, "", "imp", 3, layout, rank, RULES, into)
            assert torch.equal(into["w"], FULL["w"][rank * rows:(rank + 1) * rows])
            assert torch.equal(into["b"], FULL["b"])
    res = _invoke("ckpt", "import", str(src), str(root), "--job", "imp", "--step", "3")
    assert isinstance(res.exception, ConfigError) and res.exception.field == "--step"


def test_rm_and_gc(tmp_path):
    storage = _store(tmp_path, steps=(2, 4, 6, 8))
    res = _invoke("ckpt", "rm", str(tmp_path), "-j", "gpt", "--step", "4")
    assert res.exit_code == 0, res.output
    assert list_steps(storage, "", "gpt") == [2, 6, 8]
    assert not any(k.startswith("gpt/000000000004/") for k in storage.list(""))
    res = _invoke("ckpt", "gc", str(tmp_path), "-j", "gpt", "--keep", "1", "--dry-run")
    assert res.exit_code == 0 and "would remove 2" in res.output
    assert list_steps(storage, "", "gpt") == [2, 6, 8]
    res = _invoke("ckpt", "gc", str(tmp_path), "-j", "gpt", "--keep", "1")
    assert res.exit_code == 0, res.output
    assert list_steps(storage, "", "gpt") == [8]


def test_export_refuses_then_forces_atomically_with_the_umask_mode(tmp_path):
    _store(tmp_path / "ck")
    out = tmp_path / "m.safetensors"
    out.write_text("precious")
    args = ("ckpt", "export", str(tmp_path / "ck"), "-j", "gpt", "--to", "safetensors", "-o", str(out))
    res = _invoke(*args)
    assert isinstance(res.exception, ConfigError) and "--force" in str(res.exception)
    assert out.read_text() == "precious"
    old = os.umask(0o022)
    try:
        res = _invoke(*args, "--force")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert torch.equal(load_file(str(out))["w"], FULL["w"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    dcp_out = tmp_path / "dcp"
    res = _invoke("ckpt", "export", str(tmp_path / "ck"), "-j", "gpt", "-o", str(dcp_out))
    assert res.exit_code == 0, res.output
    res = _invoke("ckpt", "export", str(tmp_path / "ck"), "-j", "gpt", "-o", str(dcp_out))
    assert isinstance(res.exception, ConfigError) and res.exception.field == "--out"
    res = _invoke("ckpt", "export", str(tmp_path / "ck"), "-j", "gpt", "-o", str(dcp_out), "--force", "-s", "4")
    assert res.exit_code == 0, res.output
    assert (dcp_out / ".metadata").exists()


def _corrupt(storage, step, rank, tensor="b"):
    key = blob_key("", "gpt", step, rank)
    chunk = next(r.chunk for r in read_manifest(storage, "", "gpt", step).tensors[tensor].chunks if r.rank == rank)
    data = bytearray(storage.get(key))
    data[chunk.byte_offset] ^= 0xFF
    storage.put(key, data)


def test_export_warns_about_a_fallback_naming_the_copy(tmp_path):
    storage = _store(tmp_path / "ck")
    _corrupt(storage, 8, 0)  # "b" is replicated: rank 1 holds another copy
    out = tmp_path / "m.safetensors"
    res = _invoke("ckpt", "export", str(tmp_path / "ck"), "-j", "gpt", "--to", "safetensors", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "warning: corrupt or unreadable copy skipped: b@" in res.output and "rank 0 failed" in res.output
    assert torch.equal(load_file(str(out))["b"], FULL["b"])


def test_show_fails_on_a_corrupt_or_missing_blob(tmp_path):
    storage = _store(tmp_path / "ck")
    assert _invoke("ckpt", "show", str(tmp_path / "ck"), "-j", "gpt").exit_code == 0
    _corrupt(storage, 8, 1, "w")
    res = _invoke("ckpt", "show", str(tmp_path / "ck"), "-j", "gpt")
    assert isinstance(res.exception, ChecksumError)
    storage.delete(blob_key("", "gpt", 4, 0))
    res = _invoke("ckpt", "show", str(tmp_path / "ck"), "-j", "gpt", "-s", "4")
    assert isinstance(res.exception, StorageError)
    assert _invoke("ckpt", "show", str(tmp_path / "ck"), "-j", "gpt", "-s", "4", "--no-verify").exit_code == 0
