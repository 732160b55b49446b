"""The typed storage seams: each backend satisfies Storage and exactly the capabilities it implements,
and a storage or blob reader with no optional capability at all still saves, loads and verifies."""

from __future__ import annotations

import pytest
import torch

import lifeline.checkpoint as ckpt
from lifeline.checkpoint import (AzureStorage, BlobReader, FilesystemStorage, GCSStorage, Layout, MemoryStorage,
                                 PatternRules, ReadTuning, S3Storage, Sharded, Storage, StorageBlobReader,
                                 SupportsGetInto, SupportsGetPiecesInto, SupportsPutStream, SupportsReadInto,
                                 SupportsReadPiecesInto, SupportsSize, blob_key, commit, consolidate, load,
                                 persist_state, plan_shard, read_manifest, save_states, shard_state, verify_checkpoint)
from lifeline.errors import ChecksumError

STORAGE_CAPABILITIES = (SupportsSize, SupportsGetInto, SupportsGetPiecesInto, SupportsPutStream, ReadTuning)
READER_CAPABILITIES = (SupportsReadInto, SupportsReadPiecesInto, ReadTuning)
RULES = PatternRules([("w", Sharded(0))])


def _s3() -> S3Storage:
    # the client sends nothing before the first operation: no server needed (the port is unused)
    return S3Storage("127.0.0.1:9", "k" * 8, "s" * 8, "bucket")


def _azure() -> AzureStorage:
    # nothing is sent before the first operation either
    return AzureStorage("http://127.0.0.1:9/devstoreaccount1", "devstoreaccount1", "a2V5", "ckpt")


def _gcs() -> GCSStorage:
    # nor here (credentials are looked up on the first request too)
    return GCSStorage("ckpt", endpoint="http://127.0.0.1:9", credentials="anonymous")


class PlainStorage:
    """A :class:`Storage` and nothing more: the five required methods over a MemoryStorage."""

    def __init__(self) -> None:
        self.inner = MemoryStorage()

    def put(self, key, data):
        self.inner.put(key, data)

    def get(self, key, offset=0, length=None):
        return self.inner.get(key, offset, length)

    def exists(self, key):
        return self.inner.exists(key)

    def list(self, prefix):
        return self.inner.list(prefix)

    def delete(self, key):
        self.inner.delete(key)


class PlainReader:
    """A :class:`BlobReader` and nothing more (as a sidecar's reader over peers)."""

    def __init__(self, storage, job: str) -> None:
        self.storage, self.job = storage, job

    def read(self, step, rank, offset, length):
        return self.storage.get(blob_key("", self.job, step, rank), offset, length)


@pytest.mark.parametrize("make,expected", [
    (lambda root: FilesystemStorage(root, fsync=False), set(STORAGE_CAPABILITIES)),
    (lambda root: MemoryStorage(), {SupportsSize, SupportsGetInto}),
    (lambda root: _s3(), {SupportsSize, SupportsGetInto}),
    (lambda root: _azure(), {SupportsSize, SupportsGetInto}),
    (lambda root: _gcs(), {SupportsSize, SupportsGetInto}),
    (lambda root: PlainStorage(), set()),
], ids=["fs", "memory", "s3", "azure", "gcs", "plain"])
def test_each_backend_is_a_storage_with_exactly_its_capabilities(tmp_path, make, expected):
    storage = make(tmp_path)
    assert isinstance(storage, Storage)
    assert {c for c in STORAGE_CAPABILITIES if isinstance(storage, c)} == expected


def test_storage_blob_reader_offers_every_reader_capability_and_takes_the_storages_tuning(tmp_path):
    fs = FilesystemStorage(tmp_path, fsync=False)
    for storage in (fs, MemoryStorage(), PlainStorage()):
        reader = StorageBlobReader(storage, "", "j")
        assert isinstance(reader, BlobReader)
        assert all(isinstance(reader, c) for c in READER_CAPABILITIES)
    assert (StorageBlobReader(fs, "", "j").read_piece, StorageBlobReader(fs, "", "j").read_threads) == (
        fs.read_piece, fs.read_threads)
    assert (StorageBlobReader(MemoryStorage(), "", "j").read_piece,
            StorageBlobReader(MemoryStorage(), "", "j").read_threads) == (None, None)
    plain = PlainReader(MemoryStorage(), "j")
    assert isinstance(plain, BlobReader) and not any(isinstance(plain, c) for c in READER_CAPABILITIES)


def test_the_capability_protocols_are_exported():
    names = {c.__name__ for c in STORAGE_CAPABILITIES + READER_CAPABILITIES} | {"Storage", "BlobReader"}
    assert names <= set(ckpt.__all__)
    assert all(getattr(ckpt, n).__name__ == n for n in names)


def test_a_storage_without_capabilities_saves_loads_and_verifies_through_the_fallbacks():
    storage = PlainStorage()
    full = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(3), "pos": b"\x07" * 5}
    src, dst = Layout(tensor=2), Layout(tensor=4)
    save_states(storage, "", "j", 1, src, RULES, [shard_state(full, src, r, RULES) for r in range(2)])
    verify_checkpoint(storage, "", "j", 1)  # blob sizes from get(): no size()
    for r in range(4):  # a reshard through StorageBlobReader's get() fallbacks
        want = shard_state(full, dst, r, RULES)
        into = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in want.items()}
        load(storage, "", "j", 1, dst, r, RULES, into)
        assert all(torch.equal(into[k], v) if isinstance(v, torch.Tensor) else into[k] == v for k, v in want.items())
    whole = consolidate(manifest=read_manifest(storage, "", "j", 1), reader=PlainReader(storage.inner, "j"))
    assert all(torch.equal(whole[k], full[k]) for k in ("w", "b"))
    # persist_state without put_stream: the blob is put while a second thread seals it
    state = {"w": torch.randn(4, 4)}
    plan = plan_shard(state, Layout(), 0, PatternRules())
    commit(storage, "", "j", 2, Layout(), [persist_state(storage, "", plan, state, job="j", step=2)])
    assert torch.equal(consolidate(storage, "", "j", 2)["w"], state["w"])
    # a flipped byte is still caught on the plain read path
    key = blob_key("", "j", 1, 0)
    blob = bytearray(storage.get(key))
    blob[0] ^= 1
    storage.put(key, blob)
    with pytest.raises(ChecksumError):
        verify_checkpoint(storage, "", "j", 1)
