"""Units of the launcher with real counterparts: the final-state digest, seeding a fresh catalog
(real Redis) from an L2 checkpoint so a sidecar can verify the stored blobs, per-tier steps."""

from __future__ import annotations

import torch

from lifeline.checkpoint import (
    Layout,
    MemoryStorage,
    PatternRules,
    Replicated,
    Sharded,
    ShardMetadata,
    blob_key,
    read_manifest,
    save_states,
)
from lifeline.control import Holding
from lifeline.launch._observe import seed_l2_holdings, tier_steps
from lifeline.launch.summary import checksum_digest, state_digest
from lifeline.sidecar.catalog import Catalog


def test_state_digest_is_bit_exact_and_order_independent():
    a = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    b = {"b": a["b"].clone(), "w": a["w"].clone()}
    assert state_digest(a) == state_digest(b)
    flipped = b["w"].clone()
    flipped.view(torch.int32)[1, 2] ^= 1  # one bit of one element
    assert state_digest({**b, "w": flipped}) != state_digest(a)
    assert state_digest({**b, "w": b["w"].to(torch.float64)}) != state_digest(a)  # dtype counts


def test_seeded_catalog_lets_stored_blobs_verify(redis_server):
    layout = Layout(tensor=2)
    rules = PatternRules([("w", Sharded(0))], default=Replicated())
    full = torch.arange(32, dtype=torch.float32).view(8, 4)
    states = [{"w": full[r * 4:(r + 1) * 4].clone(), "bias": torch.full((3,), 2.0), "rng": bytes([r]) * 7}
              for r in range(2)]
    storage = MemoryStorage()
    save_states(storage, "", "seedjob", 8, layout, rules, states)
    manifest = read_manifest(storage, "", "seedjob", 8)
    catalog = Catalog(redis_server.url, "seedjob", 2)
    try:
        seed_l2_holdings(catalog, manifest)
        for rank in range(2):
            assert catalog.holders(8, rank) == {"L2"}
            meta = ShardMetadata.from_json(catalog.meta(8, rank))
            blob = storage.get(blob_key("", "seedjob", 8, rank))
            assert meta.nbytes == len(blob) and meta.layout == layout and meta.rank == rank
            meta.verify(memoryview(blob))  # what the sidecar does before serving an L2 copy
        corrupt = bytearray(storage.get(blob_key("", "seedjob", 8, 1)))
        corrupt[0] ^= 0xFF
        try:
            ShardMetadata.from_json(catalog.meta(8, 1)).verify(memoryview(corrupt))
        except Exception as err:  # noqa: BLE001 - the checksum error type is the format's
            assert "checksum" in str(err).lower()
        else:
            raise AssertionError("a corrupt blob verified against the seeded metadata")
        assert checksum_digest(catalog.metas(8)) == checksum_digest(catalog.metas(8))
    finally:
        catalog.r.delete(*catalog.r.keys("lifeline:seedjob:*"))
        catalog.close()


def test_tier_steps_needs_every_rank():
    h = {Holding(3, 0, "L0", 0), Holding(3, 1, "L0", 1), Holding(4, 0, "L0", 0), Holding(3, 0, "L1", 1),
         Holding(2, 0, "L2"), Holding(2, 1, "L2")}
    assert tier_steps(frozenset(h), 2) == {"L0": 3, "L1": None, "L2": 2}
