"""Helpers of the command-line tests: run the real CLI of the source under test as a subprocess.

``SRC`` is the ``src`` directory next to ``tests/`` (computed from this file), so the subprocess runs
the code of this checkout whatever is installed in the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

SRC = Path(__file__).resolve().parents[2] / "src"
MARKER = "LIFELINE_TEST_MARKER"


@dataclass
class Result:
    """A finished CLI run: exit code, output and the processes it left behind (pids)."""

    returncode: int
    stdout: str
    stderr: str
    leftovers: list[int]


def _tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries ``MARKER=tag``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARKER) == tag:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
            drop_env: tuple[str, ...] = ()) -> Result:
    """Run ``python -m lifeline ARGS`` in ``cwd``; kill (and report) any process it left running."""
    tag = uuid.uuid4().hex
    full = {k: v for k, v in os.environ.items() if k not in drop_env}
    full.update({"COLUMNS": "200", **(env or {})})
    full.update({"PYTHONPATH": str(SRC), MARKER: tag})
    proc = subprocess.run([sys.executable, "-m", "lifeline", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=timeout)
    left = _tagged(tag)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    return Result(proc.returncode, proc.stdout, proc.stderr, left)


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (relative), to compare before and after a run."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}
