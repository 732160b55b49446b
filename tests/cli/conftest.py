"""Fixtures of the command-line tests (helpers in ``_cli.py``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ckpt_store(tmp_path_factory) -> Path:
    """A filesystem checkpoint store: job ``gpt`` with committed steps 4 and 8 (two ranks, tensor=2)."""
    import torch

    from lifeline.checkpoint import FilesystemStorage, Layout, PatternRules, Sharded, save_states

    root = tmp_path_factory.mktemp("store")
    storage = FilesystemStorage(root, fsync=False)
    full = {"w": torch.arange(12, dtype=torch.float32).reshape(4, 3), "b": torch.ones(3)}
    rules = PatternRules([("w", Sharded(0))])
    for step in (4, 8):
        states = [{"w": full["w"][2 * r:2 * r + 2].clone(), "b": full["b"].clone()} for r in range(2)]
        save_states(storage, "", "gpt", step, Layout(tensor=2), rules, states)
    return root


@pytest.fixture
def unique() -> str:
    """A unique short name."""
    return uuid.uuid4().hex[:8]
