"""The from-source build cache: half-written entries are rebuilt, never used; clear errors."""

from __future__ import annotations

import json
import subprocess

import pytest

from lifeline.devcluster import build
from lifeline.errors import BuildError


def test_half_written_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("LIFELINE_CACHE", str(tmp_path))
    etcd = build.COMPONENTS["etcd"]
    d = build.entry_dir(etcd)
    d.mkdir(parents=True)
    (d / "etcd").write_bytes(b"\x7fELF truncated")  # a build killed half-way: no marker
    (d / "etcd").chmod(0o755)
    assert not build.is_complete(etcd)
    lines: list[str] = []
    out = build.ensure("etcd", log=lines.append)
    assert out == d and build.is_complete(etcd)
    assert any("half-written" in line for line in lines)
    marker = json.loads((d / ".complete").read_text())
    assert marker["sizes"]["etcd"] == (d / "etcd").stat().st_size > 1_000_000
    version = subprocess.run([str(d / "etcd"), "--version"], capture_output=True, text=True, check=True).stdout
    assert "etcd Version: 3.5.35" in version
    # a binary that no longer matches its marker makes the entry incomplete again
    with open(d / "etcd", "ab") as f:
        f.write(b"x")
    assert not build.is_complete(etcd)


def test_unknown_component_and_binary():
    with pytest.raises(BuildError, match="unknown component 'etcdd'"):
        build.ensure("etcdd")
    with pytest.raises(BuildError, match="unknown dev-cluster binary 'kubelet'"):
        build.binary("kubelet")


def test_missing_go_toolchain_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("LIFELINE_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(build, "_GO_FALLBACKS", ())
    with pytest.raises(BuildError, match="no Go toolchain found.*go.dev/dl"):
        build.ensure("helm")
