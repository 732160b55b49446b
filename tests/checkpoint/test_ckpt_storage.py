"""The storage backends against real servers: filesystem and MinIO (multipart, ranged GET, errors, retries)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from lifeline.checkpoint import FilesystemStorage, MemoryStorage, S3Storage, storage_from_uri
from lifeline.errors import StorageError


@pytest.fixture(scope="module")
def s3(minio_server):
    return S3Storage(minio_server.endpoint, minio_server.access_key, minio_server.secret_key,
                     f"storage-{uuid.uuid4().hex[:8]}", part_size=5 << 20, max_concurrency=3)


@pytest.fixture(params=["fs", "memory", "s3"])
def storage(request, tmp_path):
    if request.param == "fs":
        return FilesystemStorage(tmp_path, fsync=True)
    if request.param == "memory":
        return MemoryStorage()
    return request.getfixturevalue("s3")


def test_put_get_ranges_list_delete(storage):
    ns = uuid.uuid4().hex[:6]
    data = os.urandom(12 << 20) if isinstance(storage, S3Storage) else os.urandom(1 << 20)  # S3: 3 parts
    storage.put(f"{ns}/a/x.bin", memoryview(data))
    storage.put(f"{ns}/a/y.json", b"{}")
    storage.put(f"{ns}/b.bin", b"")
    storage.put(f"{ns}/g.bin", [b"ab", memoryview(b"cd"), bytearray(), bytearray(b"e")])  # a gather put
    assert storage.get(f"{ns}/g.bin") == b"abcde"
    storage.delete(f"{ns}/g.bin")
    assert storage.get(f"{ns}/a/x.bin") == data
    assert storage.get(f"{ns}/a/x.bin", 12345, 1000) == data[12345:13345]
    out = bytearray(777)
    storage.get_into(f"{ns}/a/x.bin", len(data) - 777, out)
    assert bytes(out) == data[-777:]
    assert storage.get(f"{ns}/b.bin") == b""
    assert storage.list(f"{ns}/a/") == [f"{ns}/a/x.bin", f"{ns}/a/y.json"]
    assert storage.list(f"{ns}/") == [f"{ns}/a/x.bin", f"{ns}/a/y.json", f"{ns}/b.bin"]
    assert storage.exists(f"{ns}/a/y.json") and not storage.exists(f"{ns}/a/z")
    storage.put(f"{ns}/a/y.json", b"[1]")
    assert storage.get(f"{ns}/a/y.json") == b"[1]"
    storage.delete(f"{ns}/a/y.json")
    storage.delete(f"{ns}/a/never")
    assert storage.list(f"{ns}/a/") == [f"{ns}/a/x.bin"]
    with pytest.raises(StorageError) as err:
        storage.get(f"{ns}/missing")
    assert err.value.key == f"{ns}/missing"


def test_filesystem_rejects_escaping_keys_and_leaves_no_temp_files(tmp_path):
    fs = FilesystemStorage(tmp_path / "root")
    for bad in ("../x", "/abs", "a//b", "a/./b"):
        with pytest.raises(StorageError, match="invalid storage key"):
            fs.put(bad, b"x")
    fs.put("k/v", b"1")
    assert sorted(os.listdir(tmp_path / "root" / "k")) == ["v"]
    with pytest.raises(StorageError, match="outside object"):
        fs.get("k/v", 0, 2)


def test_s3_unreachable_endpoint_retries_then_raises_storage_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: connection refused
    st = S3Storage(f"127.0.0.1:{port}", "k" * 8, "s" * 8, "bkt", retries=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(StorageError, match="after 3 attempts") as err:
        st.get("some/key")
    assert err.value.key == "some/key"


def test_s3_bad_bucket_name_is_a_storage_error(minio_server):
    st = S3Storage(minio_server.endpoint, minio_server.access_key, minio_server.secret_key, "B_")
    with pytest.raises(StorageError, match="invalid bucket name"):
        st.put("k", b"v")


def test_storage_from_uri(tmp_path, minio_server, monkeypatch):
    fs, prefix = storage_from_uri(f"file://{tmp_path}")
    assert isinstance(fs, FilesystemStorage) and prefix == ""
    monkeypatch.setenv("LIFELINE_S3_ENDPOINT", minio_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio_server.secret_key)
    s3, prefix = storage_from_uri("s3://uri-test/ckpt/run1")
    assert isinstance(s3, S3Storage) and s3.bucket == "uri-test" and prefix == "ckpt/run1"
    s3.put(f"{prefix}/k", b"v")
    assert s3.get(f"{prefix}/k") == b"v"
    monkeypatch.delenv("LIFELINE_S3_ENDPOINT")
    with pytest.raises(StorageError, match="endpoint"):
        storage_from_uri("s3://uri-test/x")
