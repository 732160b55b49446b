"""``lifeline ckpt ls | show | verify | export`` on a real checkpoint directory."""

from __future__ import annotations

import torch
from ckpt_models import assert_states_equal, build_model, states_for
from safetensors.torch import load_file
from typer.testing import CliRunner

from lifeline.checkpoint import FilesystemStorage, Layout, blob_key, read_manifest, save_states
from lifeline.cli import app

runner = CliRunner()


def _make(tmp_path):
    model = build_model(9, 2, 1, 2, 10, 1, torch.float32)
    layout = Layout(tensor=2)
    storage = FilesystemStorage(tmp_path, fsync=False)
    for step in (4, 8):
        save_states(storage, "", "gpt", step, layout, model.rules, states_for(model, layout))
    storage.put(blob_key("", "gpt", 12, 0), b"torn")  # never committed
    return model, storage


def test_ls_show_verify_export(tmp_path):
    model, storage = _make(tmp_path / "ck")
    uri = str(tmp_path / "ck")
    res = runner.invoke(app, ["ckpt", "ls", uri], terminal_width=200)
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "gpt" in line)  # the title holds the tmp path
    assert "4, 8" in row and "12" not in row

    res = runner.invoke(app, ["ckpt", "show", f"file://{uri}", "--job", "gpt"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "step 8" in res.output and "layers.0.attn.qkv" in res.output and "sub_params" in res.output

    res = runner.invoke(app, ["ckpt", "verify", uri, "--job", "gpt", "--step", "4"])
    assert res.exit_code == 0 and "ok" in res.output, res.output

    out = tmp_path / "m.safetensors"
    res = runner.invoke(app, ["ckpt", "export", uri, "--job", "gpt", "--to", "safetensors", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert_states_equal(load_file(str(out)), model.full)


def test_verify_names_the_corrupt_chunk(tmp_path):
    _make(tmp_path / "ck")
    storage = FilesystemStorage(tmp_path / "ck", fsync=False)
    key = blob_key("", "gpt", 8, 1)
    manifest = read_manifest(storage, "", "gpt", 8)
    chunk = next(ref.chunk for ref in manifest.tensors["embed"].chunks if ref.rank == 1)
    data = bytearray(storage.get(key))
    data[chunk.byte_offset + chunk.byte_length - 1] ^= 1
    storage.put(key, data)
    res = runner.invoke(app, ["ckpt", "verify", str(tmp_path / "ck"), "--job", "gpt"])
    assert res.exit_code != 0
    assert "checksum mismatch" in str(res.exception) and "rank=1" in str(res.exception)
    assert "'embed'" in str(res.exception)


def test_ls_and_verify_an_s3_uri(minio_server, monkeypatch):
    from lifeline.checkpoint import S3Storage

    model = build_model(10, 1, 1, 2, 10, 1, torch.float32)
    storage = S3Storage(minio_server.endpoint, minio_server.access_key, minio_server.secret_key, "cli-test")
    save_states(storage, "runs/a", "gpt", 3, Layout(), model.rules, states_for(model, Layout()))
    monkeypatch.setenv("LIFELINE_S3_ENDPOINT", minio_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio_server.secret_key)
    res = runner.invoke(app, ["ckpt", "ls", "s3://cli-test/runs/a", "--s3-insecure"], terminal_width=200)
    assert res.exit_code == 0 and "gpt" in res.output, res.output
    res = runner.invoke(app, ["ckpt", "verify", "s3://cli-test/runs/a", "--job", "gpt", "--s3-insecure"])
    assert res.exit_code == 0 and "ok gpt step 3" in res.output, res.output
