"""Checksum blocks of small chunks end on rows of the split dim, so a reshard cutting a chunk between rows reads
exact blocks (the format rule of docs/checkpoint.md "Format"; a writer's choice: version-1 readers read any
block size, and checkpoints sealed with 4 KiB blocks still load)."""

from __future__ import annotations

import pytest
import torch

from lifeline.checkpoint import (
    FORMAT_VERSION,
    Layout,
    MemoryStorage,
    PatternRules,
    Sharded,
    StorageBlobReader,
    choose_block_size,
    plan_load,
    read_manifest,
    save_states,
    shard_state,
)
from lifeline.checkpoint._loader import execute_load


@pytest.mark.parametrize("byte_length,lengths,itemsize,split_dim,want", [
    (3072, (24, 32), 4, 0, 64),  # 24 rows of 128 B: 64 B blocks (about 1/128 of the chunk, at least 64 B)
    (682 * 384, (682, 96), 4, 0, 128),  # rows of 384 B: capped at 128, the largest power of two dividing a row
    (3072, (8, 96), 4, 1, 64),  # a column split (rows of 4 B): the 64 B floor
    (44, (11,), 4, 0, 64),  # a tiny 1-D chunk: one short block
    (500 << 10, (128000,), 4, 0, 256),  # a 1-D chunk (rows of 4 B): at most ~2048 blocks
    (0, (0, 32), 4, 0, 64),
    (2 << 20, (512, 1024), 4, 0, 16384),  # 512 KiB and more: as before (byte_length / 128, >= 4 KiB)
    (1 << 20, (256, 1024), 4, None, 8192),
    (1 << 30, (1 << 18, 1024), 4, 0, 1 << 20),
])
def test_the_block_size_of_a_chunk(byte_length, lengths, itemsize, split_dim, want):
    got = choose_block_size(byte_length, lengths, itemsize, split_dim)
    assert got == want and got % 64 == 0


@pytest.mark.parametrize("a,b", [(4, 3), (3, 2), (4, 2), (2, 3)])
def test_a_row_reshard_of_small_chunks_reads_exactly_the_rows_it_needs(a, b):
    full = {"w": torch.randn(24, 32), "v": torch.randn(48, 64)}  # chunks of 768 B .. 6 KiB, rows of 128 and 256 B
    rules = PatternRules([("*", Sharded(0))])
    storage = MemoryStorage()
    src, dst = Layout(tensor=a), Layout(tensor=b)
    save_states(storage, "", "j", 1, src, rules, [shard_state(full, src, r, rules) for r in range(a)])
    manifest = read_manifest(storage, "", "j", 1)
    assert manifest.version == FORMAT_VERSION == 1
    for r in range(b):
        want = shard_state(full, dst, r, rules)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        plan = plan_load(manifest, dst, r, rules, into)
        assert plan.read_bytes == plan.needed_bytes, (r, plan.read_bytes, plan.needed_bytes)
        report = execute_load(plan, manifest, StorageBlobReader(storage, "", "j"), into)
        assert report.read_bytes == report.needed_bytes
        for k in want:
            assert torch.equal(into[k], want[k]), k


def test_a_checkpoint_sealed_with_4_kib_blocks_still_loads_reading_whole_blocks():
    full = {"w": torch.randn(24, 32)}
    rules = PatternRules([("*", Sharded(0))])
    storage = MemoryStorage()
    src, dst = Layout(tensor=4), Layout(tensor=3)
    save_states(storage, "", "old", 1, src, rules, [shard_state(full, src, r, rules) for r in range(4)],
                block_size=4096)
    manifest = read_manifest(storage, "", "old", 1)
    assert {ref.chunk.block_size for ref in manifest.tensors["w"].chunks} == {4096}
    want = shard_state(full, dst, 0, rules)
    into = {"w": torch.zeros_like(want["w"])}
    report = execute_load(plan_load(manifest, dst, 0, rules, into), manifest, StorageBlobReader(storage, "", "old"),
                          into)
    assert torch.equal(into["w"], want["w"])
    assert report.read_bytes == 2 * 768 > report.needed_bytes == 8 * 128  # a 768 B chunk read whole for 2 rows
