"""The filesystem's fast paths: O_DIRECT / pipelined writes of any alignment, and the loader's
piece-by-piece read with the checksum fused (corruption in any piece is caught; next copy used)."""

from __future__ import annotations

import mmap
import os
import random

import pytest
import torch

from lifeline.checkpoint import (
    FilesystemStorage, Layout, PatternRules, Replicated, Sharded, blob_key, load, persist_shard, plan_shard,
    read_manifest, save_states, shard_state, write_shard,
)
from lifeline.checkpoint._direct import DIRECT_ALIGN, DIRECT_WRITE, write_direct, write_pipelined
from lifeline.errors import ChecksumError, StorageError

SIZES = [1, DIRECT_ALIGN - 1, DIRECT_ALIGN, DIRECT_ALIGN + 1, DIRECT_WRITE - 1, DIRECT_WRITE,
         DIRECT_WRITE + DIRECT_ALIGN, 2 * DIRECT_WRITE + 777]


def _pieces(rng: random.Random, n: int) -> tuple[bytes, list]:
    """A page-aligned source of ``n`` random bytes cut at random points into views (contiguous runs)
    and copies (unaligned, elsewhere in memory), with empty pieces between."""
    arena = mmap.mmap(-1, max(n, 1))
    data = rng.randbytes(n)
    arena[:n] = data
    view = memoryview(arena)[:n]
    cuts = sorted({rng.randrange(0, n + 1) for _ in range(rng.randrange(0, 10))} | {n})
    pieces: list = []
    prev = 0
    for c in cuts:
        seg = view[prev:c]
        pieces.append(bytes(seg) if rng.random() < 0.3 else seg)
        if rng.random() < 0.2:
            pieces.append(b"")
        prev = c
    return data, pieces


@pytest.mark.parametrize("write", [write_direct, write_pipelined])
def test_stream_writers_store_exactly_the_bytes_whatever_the_alignment(tmp_path, write):
    """``write_direct`` works on any fd (its alignment rules are stricter than needed), so this runs
    its bookkeeping (in-place runs, bounce copies, padded tail + truncate) on every filesystem."""
    rng = random.Random(7)
    for i, n in enumerate(SIZES + [rng.randrange(1, 3 * DIRECT_WRITE) for _ in range(6)]):
        data, pieces = _pieces(rng, n)
        path = tmp_path / f"f{i}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            assert write(fd, iter(pieces)) == n
        finally:
            os.close(fd)
        assert path.read_bytes() == data, f"size {n}"


def test_concurrent_direct_writers_outnumbering_the_bounce_pool_all_finish(tmp_path):
    """More writers at once than the bounce-buffer pool keeps: buffers released to a full pool are
    closed while the writer thread may still hold a view of them; every write must still finish
    with the right bytes (a writer thread that died there would leave its producer blocked)."""
    import threading

    from lifeline.checkpoint import _direct

    rng = random.Random(11)
    jobs = []
    for i in range(3 * _direct._POOL_MAX):
        data = rng.randbytes(2 * DIRECT_WRITE + 999)
        jobs.append((tmp_path / f"c{i}", data, [data[:777], data[777:]]))  # unaligned: every byte bounced
    errors: list[BaseException] = []

    def write(path, pieces) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_direct(fd, iter(pieces))
            finally:
                os.close(fd)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(path, pieces), daemon=True) for path, _, pieces in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a direct writer hung"
    assert not errors, errors
    for path, data, _ in jobs:
        assert path.read_bytes() == data


@pytest.mark.parametrize("fsync,direct", [(True, None), (False, None), (True, False)])
def test_filesystem_put_and_put_stream_roundtrip(tmp_path, fsync, direct):
    storage = FilesystemStorage(tmp_path, fsync=fsync, direct=direct)
    assert storage.direct == (fsync if direct is None else direct)
    rng = random.Random(3)
    for i, n in enumerate([0, 5, DIRECT_WRITE + 3, 2 * DIRECT_WRITE + DIRECT_ALIGN]):
        data, pieces = _pieces(rng, n) if n else (b"", [])
        storage.put_stream(f"s/{i}", iter(pieces))
        storage.put(f"p/{i}", pieces)
        assert storage.get(f"s/{i}") == data and storage.get(f"p/{i}") == data
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]


def test_put_stream_that_fails_midway_leaves_the_old_object_and_no_temp_file(tmp_path):
    storage = FilesystemStorage(tmp_path, fsync=True)
    storage.put("k", b"old")
    arena = mmap.mmap(-1, 3 * DIRECT_WRITE)

    def pieces():
        yield memoryview(arena)[: 2 * DIRECT_WRITE]  # in flight on the writer thread
        yield b"x" * 100  # a bounce copy
        raise StorageError("sealing failed", key="k")

    with pytest.raises(StorageError, match="sealing failed"):
        storage.put_stream("k", pieces())
    assert storage.get("k") == b"old"
    assert os.listdir(tmp_path) == ["k"]


def _saved(tmp_path, rows: int):
    """Two tensor ranks; ``norm`` is replicated (a copy on each rank), ``w`` sharded (one copy).
    Chunks of several MiB, so a load reads each in several 1 MiB pieces."""
    rules = PatternRules([("w", Sharded(0)), ("norm", Replicated())])
    g = torch.Generator().manual_seed(1)
    full = {"w": torch.randn(2 * rows, 1024, generator=g), "norm": torch.randn(rows, 1024, generator=g)}
    layout = Layout(tensor=2)
    storage = FilesystemStorage(tmp_path, fsync=True)
    save_states(storage, "", "j", 1, layout, rules, [shard_state(full, layout, r, rules) for r in range(2)])
    return storage, rules, full, layout


def _flip(storage, key: str, at: int) -> bytes:
    original = storage.get(key)
    data = bytearray(original)
    data[at] ^= 0x20
    storage.put(key, data)
    return original


@pytest.mark.parametrize("where", ["first_piece", "middle_piece", "last_block"])
def test_fused_read_catches_corruption_in_any_piece(tmp_path, where):
    storage, rules, full, layout = _saved(tmp_path, rows=896)  # 3.5 MiB chunks: 4 pieces
    manifest = read_manifest(storage, "", "j", 1)
    for fqn in ("norm", "w"):
        ref = next(c for c in manifest.tensors[fqn].chunks if c.rank == 0)
        c = ref.chunk
        at = c.byte_offset + {"first_piece": 17, "middle_piece": (2 << 20) + 5,
                              "last_block": c.byte_length - 3}[where]
        key = blob_key("", "j", 1, 0)
        original = _flip(storage, key, at)
        want = shard_state(full, layout, 0, rules)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        if fqn == "norm":  # replicated: rank 1's copy is used, and reported
            report = load(storage, "", "j", 1, layout, 0, rules, into)
            assert len(report.fallbacks) == 1 and "norm" in report.fallbacks[0]
            assert all(torch.equal(into[k], want[k]) for k in want)
        else:
            with pytest.raises(ChecksumError, match="'w'") as err:
                load(storage, "", "j", 1, layout, 0, rules, into)
            assert err.value.rank == 0
        storage.put(key, original)


def test_reshard_from_a_page_aligned_arena_reads_back_bit_identical(tmp_path):
    """The sidecar path: a blob in a page-aligned slot persisted (written in place with O_DIRECT where
    the filesystem allows), then loaded into another layout piece by piece."""
    rules = PatternRules([("w", Sharded(0)), ("norm", Replicated())])
    g = torch.Generator().manual_seed(2)
    full = {"w": torch.randn(1536, 1024, generator=g), "norm": torch.randn(3, 1024, generator=g)}
    storage = FilesystemStorage(tmp_path, fsync=True)
    src = Layout(tensor=2)
    metas = []
    for r in range(2):
        state = shard_state(full, src, r, rules)
        plan = plan_shard(state, src, r, rules)
        arena = mmap.mmap(-1, plan.nbytes)
        write_shard(plan, state, arena)
        metas.append(persist_shard(storage, "", plan, arena, job="j", step=3))
    from lifeline.checkpoint import commit

    commit(storage, "", "j", 3, src, metas)
    dst = Layout(tensor=4)
    for r in range(4):
        want = shard_state(full, dst, r, rules)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        report = load(storage, "", "j", 3, dst, r, rules, into, threads=4)
        assert report.fallbacks == [] and all(torch.equal(into[k], want[k]) for k in want)
