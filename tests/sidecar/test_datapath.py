"""The sidecar's data path pieces: the parallel copy into the arena, streaming verification of a
received blob, and the L2 multipart uploader (against a real MinIO)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from lifeline.checkpoint import Layout, PatternRules, plan_shard, seal_shard, write_shard
from lifeline.errors import ChecksumError, LayoutError, StorageError
from lifeline.checkpoint import _s3_upload as _upload
from lifeline.sidecar.client._copy import MIN_PARALLEL_BYTES, write_parallel
from lifeline.sidecar._verify import BlobVerifier


def _state(total_bytes: int) -> dict:
    g = torch.Generator().manual_seed(0)
    sizes = [total_bytes // 2, total_bytes // 4, total_bytes // 8, total_bytes // 8 - 4096, 4096]
    state = {f"w{i}": torch.empty(n // 4).uniform_(generator=g) for i, n in enumerate(sizes)}
    state["h"] = torch.randint(0, 100, (7, 3), generator=g, dtype=torch.int64)
    state["loader"] = b"position=42"
    return state


def test_parallel_copy_writes_the_same_bytes_as_write_shard():
    state = _state(MIN_PARALLEL_BYTES + (4 << 20))
    plan = plan_shard(state, Layout(), 0, PatternRules([]))
    want = bytearray(plan.nbytes)
    write_shard(plan, state, memoryview(want))
    with ThreadPoolExecutor(2) as pool:
        for threads in (2, 3):
            got = bytearray(plan.nbytes)
            write_parallel(plan, state, memoryview(got), pool, threads)
            assert got == want
        bad = dict(state, w1=torch.zeros(3))
        with pytest.raises(LayoutError, match="w1"):
            write_parallel(plan, bad, memoryview(bytearray(plan.nbytes)), pool, 2)


def _sealed():
    state = _state(4 << 20)
    plan = plan_shard(state, Layout(), 0, PatternRules([]))
    blob = bytearray(plan.nbytes)
    write_shard(plan, state, memoryview(blob))
    return blob, seal_shard(plan, memoryview(blob), job="j", step=3, block_size=64 << 10)


def _stream(meta, blob: bytearray, steps: int = 37) -> BlobVerifier:
    v = BlobVerifier(meta.to_json(), memoryview(blob), rank=0, step=3, tier="L1")
    for i in range(1, steps + 1):  # progress marks that fall anywhere inside blocks
        v.check(len(blob) * i // steps)
    return v


def test_blob_verifier_accepts_a_good_blob_in_any_pieces():
    blob, meta = _sealed()
    _stream(meta, blob).finish()


def test_blob_verifier_names_the_corrupt_tensor_and_waits_for_the_end():
    blob, meta = _sealed()
    w0 = next(t for t in meta.tensors if t.fqn == "w0").chunks[0]
    blob[w0.byte_offset + 70_000] ^= 0x01  # inside the second block of w0
    v = _stream(meta, blob)
    assert v.error is not None  # seen during the transfer, raised at the end
    with pytest.raises(ChecksumError, match="w0") as info:
        v.finish()
    assert (info.value.rank, info.value.step, info.value.tier) == (0, 3, "L1")


def test_blob_verifier_checks_byte_entries_and_refuses_a_short_blob():
    blob, meta = _sealed()
    entry = meta.bytes_entries[0]
    bad = bytearray(blob)
    bad[entry.byte_offset] ^= 0xFF
    with pytest.raises(ChecksumError, match="loader"):
        _stream(meta, bad).finish()
    with pytest.raises(ChecksumError, match="metadata needs"):
        BlobVerifier(meta.to_json(), memoryview(blob)[:-4096], rank=0, step=3, tier="L1").finish()


def test_uploader_puts_single_and_multipart_objects(minio_server):
    from minio import Minio

    m = minio_server
    up = _upload.S3Uploader(m.endpoint, m.access_key, m.secret_key, "uploader-test", part_size=5 << 20,
                            concurrency=3, retries=1)
    client = Minio(m.endpoint, access_key=m.access_key, secret_key=m.secret_key, secure=False)
    try:
        small, big = bytes(range(256)) * 4, torch.randint(0, 255, (12 << 20,), dtype=torch.uint8).numpy().tobytes()
        up.put("a/small", memoryview(small))
        up.put("a/big", memoryview(bytearray(big)))
        assert client.get_object("uploader-test", "a/small").read() == small
        assert client.get_object("uploader-test", "a/big").read() == big
    finally:
        up.close()


def test_uploader_part_with_wrong_checksum_is_rejected_and_nothing_appears(minio_server, monkeypatch):
    from minio import Minio

    m = minio_server
    up = _upload.S3Uploader(m.endpoint, m.access_key, m.secret_key, "uploader-test", part_size=5 << 20,
                            concurrency=2, retries=0)
    client = Minio(m.endpoint, access_key=m.access_key, secret_key=m.secret_key, secure=False)
    real = _upload._crc_header
    # bytes that change in transit look, to the server, like a crc that does not match them
    monkeypatch.setattr(_upload, "_crc_header", lambda v: real(bytes(v[:-1]) + bytes([v[-1] ^ 1])))
    try:
        for key, n in (("b/multi", 11 << 20), ("b/single", 1000)):
            with pytest.raises(StorageError, match="Checksum"):
                up.put(key, memoryview(bytearray(n)))
            assert not [o for o in client.list_objects("uploader-test", prefix=key)]
    finally:
        up.close()
