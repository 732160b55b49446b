"""Help as a user reads it: 80 columns, user commands before internal roles, no ``<bool>``; README agrees."""

from __future__ import annotations

import re

from ._cli import SRC, run_cli

USER = ["run", "validate", "jobs", "describe", "logs", "stop", "ckpt", "bench", "devcluster"]
ROLES = ["sidecar", "trainer", "operator", "node"]


def _help(tmp_path, *args):
    res = run_cli([*args, "--help"], cwd=tmp_path, env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_top_level_help(tmp_path):
    out = _help(tmp_path)
    assert all(len(line) <= 80 for line in out.splitlines())
    names = [m.group(1) for m in re.finditer(r"^│ (\w+)\s", out, re.M) if m.group(1) in USER + ROLES]
    assert names == USER + ROLES
    assert "Internal roles" in out and "<bool>" not in out


def test_run_help_flags(tmp_path):
    out = _help(tmp_path, "run")
    assert "<bool>" not in out and "(repeatable)" in out and "{" not in out.splitlines()[1]


def test_readme_lists_the_commands_and_injection_kinds():
    readme = (SRC.parent / "README.md").read_text()
    for name in USER:
        assert f"`lifeline {name}" in readme or f"lifeline {name}" in readme, name
    for kind in ("trainer", "sidecar", "node", "hang"):
        assert f"`{kind}:rank=R:step=S`" in readme, kind
    assert (SRC.parent / "docs" / "cli.md").exists()
