"""Non-tensor state: RNG states, Stateful objects and scalars go through a real save/load."""

from __future__ import annotations

import random

import numpy as np
import torch

from lifeline.checkpoint import (Layout, MemoryStorage, PatternRules, load, load_stateful, pack_rng_state,
                                 restore_rng_state, save_states, stateful_entries)
from lifeline.errors import ManifestError


class Loader:
    """A data loader position with a tensor inside (a permutation) and plain values."""

    def __init__(self, seed: int) -> None:
        self.epoch, self.index = 0, 0
        self.perm = torch.randperm(50, generator=torch.Generator().manual_seed(seed))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "perm": self.perm, "history": [1.5, "x"]}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.index, self.perm = sd["epoch"], sd["index"], sd["perm"]
        assert sd["history"] == [1.5, "x"]


def test_rng_and_stateful_roundtrip_through_a_checkpoint():
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    loader = Loader(1)
    loader.epoch, loader.index = 2, 17
    state = {"w": torch.randn(4), "rng": pack_rng_state(), **stateful_entries("loader", loader)}
    expected = (torch.rand(3), random.random(), np.random.rand())  # what the RNGs give after the save
    storage = MemoryStorage()
    save_states(storage, "", "j", 1, Layout(), PatternRules(), [state])

    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    into = {"w": torch.zeros(4), "rng": None, "loader.__state__": None, "loader.perm": torch.zeros(50, dtype=torch.int64)}
    load(storage, "", "j", 1, Layout(), 0, PatternRules(), into)
    restore_rng_state(into["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]
    fresh = Loader(2)
    load_stateful("loader", fresh, into)
    assert (fresh.epoch, fresh.index) == (2, 17) and torch.equal(fresh.perm, loader.perm)


def test_bad_rng_bytes_raise_manifest_error():
    try:
        restore_rng_state(b"not a pickle")
    except ManifestError as err:
        assert err.key == "rng"
    else:
        raise AssertionError("no error")
