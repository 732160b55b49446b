"""The pipelined load: a reader thread streams each rank's blob in large calls on one open file
while the loading thread verifies; a failed call fails only its reads, the next copy is used."""

from __future__ import annotations

import os
import queue

import pytest
import torch

from lifeline.checkpoint import FilesystemStorage, Layout, PatternRules, Replicated, Sharded, StorageBlobReader, blob_key
from lifeline.checkpoint import execute_load, plan_load, read_manifest, save_states, shard_state
from lifeline.checkpoint._read_stream import FAST_READ, PIPELINE_PIECE, ReadStream, pipeline_piece
from lifeline.errors import ChecksumError, StorageError

KiB = 1 << 10


class RecordingStorage:
    """A real :class:`FilesystemStorage` that records each ``get_pieces_into`` (one open file) and the
    byte size of every read call made through it; ``fail_at``: ``(key, offset)`` whose call raises."""

    def __init__(self, root) -> None:
        self.inner = FilesystemStorage(root, fsync=False)
        # the read tuning is forwarded explicitly: capabilities are found with isinstance, which
        # does not see what __getattr__ forwards from Python 3.12 on
        self.read_piece, self.read_threads = self.inner.read_piece, self.inner.read_threads
        self.opens: list[str] = []
        self.calls: list[int] = []
        self.fail_at: set[int] = set()

    def get_pieces_into(self, key, pieces):
        self.opens.append(key)

        def tap():
            for offset, out in pieces:
                n = sum(len(memoryview(b).cast("B")) for b in (out if isinstance(out, list) else [out]))
                if any(k == key and offset <= f < offset + n for k, f in self.fail_at):
                    raise StorageError(f"injected failure at byte {offset}", key=key)
                self.calls.append(n)
                yield offset, out

        yield from self.inner.get_pieces_into(key, tap())

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _blob(storage: RecordingStorage, rank: int, nbytes: int) -> bytes:
    data = os.urandom(nbytes)
    storage.inner.put(blob_key("", "j", 1, rank), data)
    return data


def _read(offset: int, nbytes: int, piece: int) -> tuple[bytearray, list]:
    buf = bytearray(nbytes)
    mv = memoryview(buf)
    return buf, [(offset + i, [mv[i : i + piece]]) for i in range(0, nbytes, piece)]


def _drain(progress: queue.SimpleQueue) -> list:
    out = []
    while (item := progress.get(timeout=30)) is not None:
        out.append(item)
    return out


def test_consecutive_reads_of_a_blob_share_one_open_file_in_merged_calls(tmp_path):
    storage = RecordingStorage(tmp_path)
    data = _blob(storage, 0, 96 * KiB)
    stream = ReadStream(StorageBlobReader(storage, "", "j"), 1, lambda left, rate: 16 * KiB)
    reads = [_read(off, 32 * KiB, 4 * KiB) for off in (0, 32 * KiB, 64 * KiB)]
    progresses = [stream.submit(0, pieces, 0) for _, pieces in reads]
    ends = [_drain(p) for p in progresses]
    stream.close()
    for (buf, pieces), got, off in zip(reads, ends, (0, 32 * KiB, 64 * KiB)):
        assert bytes(buf) == data[off : off + 32 * KiB]
        assert got == [o + 4 * KiB for o, _ in pieces]  # every piece reported, in order
    assert storage.opens == [blob_key("", "j", 1, 0)]  # one open file for the three reads
    assert sum(storage.calls) == 96 * KiB and max(storage.calls) <= 16 * KiB and len(storage.calls) <= 24


def test_a_failed_call_fails_its_read_and_later_reads_are_still_served(tmp_path):
    storage = RecordingStorage(tmp_path)
    data = {r: _blob(storage, r, 64 * KiB) for r in (0, 1)}
    storage.fail_at = {(blob_key("", "j", 1, 0), 40 * KiB)}
    stream = ReadStream(StorageBlobReader(storage, "", "j"), 1, lambda left, rate: 4 * KiB)  # no merging
    reads = [(0, *_read(0, 32 * KiB, 4 * KiB)), (0, *_read(32 * KiB, 32 * KiB, 4 * KiB)),
             (1, *_read(0, 64 * KiB, 4 * KiB))]
    progresses = [stream.submit(rank, pieces, 0) for rank, _, pieces in reads]
    got = [_drain(p) for p in progresses]
    stream.close()
    assert got[0] == [(i + 1) * 4 * KiB for i in range(8)] and bytes(reads[0][1]) == data[0][: 32 * KiB]
    assert got[1][:2] == [36 * KiB, 40 * KiB]  # the pieces before the failure are reported, then the error
    assert isinstance(got[1][2], StorageError) and "40960" in str(got[1][2]) and len(got[1]) == 3
    assert bytes(reads[2][1]) == data[1] and got[2][-1] == 64 * KiB  # the other rank's read is unaffected


def test_a_blob_that_cannot_be_opened_fails_each_of_its_reads(tmp_path):
    storage = RecordingStorage(tmp_path)
    stream = ReadStream(StorageBlobReader(storage, "", "j"), 1, lambda left, rate: 8 * KiB)
    progresses = [stream.submit(3, _read(off, 8 * KiB, 4 * KiB)[1], 0) for off in (0, 8 * KiB)]
    got = [_drain(p) for p in progresses]
    stream.close()
    for g in got:
        assert len(g) == 1 and isinstance(g[0], StorageError) and "rank-3" in str(g[0])


def test_call_size_grows_on_a_slow_device_shrinks_at_the_end_and_stays_small_from_memory():
    lo, hi = PIPELINE_PIECE
    slow = 1 << 30
    assert pipeline_piece(1 << 30, 0.0) == lo  # the first call measures the rate
    assert pipeline_piece(1 << 30, slow) == hi
    assert pipeline_piece(3 * lo, slow) == lo and pipeline_piece(lo, slow) == lo
    assert lo < pipeline_piece(hi, slow) < hi
    assert pipeline_piece(1 << 30, 2 * FAST_READ) == lo


def _saved(tmp_path, rules=None):
    rules = rules or PatternRules([("w", Sharded(0)), ("norm", Replicated())])
    g = torch.Generator().manual_seed(3)
    full = {"w": torch.randn(2048, 1024, generator=g), "norm": torch.randn(512, 1024, generator=g)}
    layout = Layout(tensor=2)
    storage = FilesystemStorage(tmp_path, fsync=False)
    save_states(storage, "", "j", 1, layout, rules, [shard_state(full, layout, r, rules) for r in range(2)])
    return storage, rules, full, layout


@pytest.mark.parametrize("pipelined", [True, False])
def test_truncated_blob_replicated_tensors_use_the_next_copy_sharded_ones_fail(tmp_path, pipelined):
    key = blob_key("", "j", 1, 0)
    for rules in (PatternRules(default=Replicated()), None):
        storage, rules, full, layout = _saved(tmp_path / str(rules is None), rules)
        manifest = read_manifest(storage, "", "j", 1)
        want = shard_state(full, layout, 0, rules)
        reader = StorageBlobReader(storage, "", "j")
        original = storage.get(key)
        storage.put(key, original[: len(original) - 5000])  # the last piece of rank 0's blob is cut
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        plan = plan_load(manifest, layout, 0, rules, into)
        if all(isinstance(rules.match(k), Replicated) for k in want):  # every chunk has a copy on rank 1
            report = execute_load(plan, manifest, reader, into, threads=1, pipelined=pipelined)
            assert len(report.fallbacks) == 2 and all("rank 0 failed" in f for f in report.fallbacks)
            assert all(torch.equal(into[k], want[k]) for k in want)
        else:
            with pytest.raises(StorageError, match="outside object") as err:
                execute_load(plan, manifest, reader, into, threads=1, pipelined=pipelined)
            assert err.value.key == key
        storage.put(key, original)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        assert execute_load(plan, manifest, reader, into, threads=1, pipelined=pipelined).fallbacks == []
        assert all(torch.equal(into[k], want[k]) for k in want)


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_flipped_byte_is_caught_on_both_paths(tmp_path, pipelined):
    storage, rules, full, layout = _saved(tmp_path)
    manifest = read_manifest(storage, "", "j", 1)
    w = next(c.chunk for c in manifest.tensors["w"].chunks if c.rank == 0)
    key = blob_key("", "j", 1, 0)
    data = bytearray(storage.get(key))
    data[w.byte_offset + w.byte_length // 2 + 1] ^= 1
    storage.put(key, bytes(data))
    into = {k: torch.zeros_like(v) for k, v in shard_state(full, layout, 0, rules).items()}
    plan = plan_load(manifest, layout, 0, rules, into)
    with pytest.raises(ChecksumError, match="'w'"):
        execute_load(plan, manifest, StorageBlobReader(storage, "", "j"), into, threads=1, pipelined=pipelined)
