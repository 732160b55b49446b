"""The storage backends against real servers: filesystem, MinIO, Azurite and fake-gcs-server (multipart, block and
resumable uploads, ranged GET, errors, retries)."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from lifeline.checkpoint import (AzureStorage, FilesystemStorage, GCSStorage, MemoryStorage, S3Storage,
                                 storage_from_uri)
from lifeline.errors import StorageError


@pytest.fixture(scope="module")
def s3(minio_server):
    return S3Storage(minio_server.endpoint, minio_server.access_key, minio_server.secret_key,
                     f"storage-{uuid.uuid4().hex[:8]}", part_size=5 << 20, max_concurrency=3)


@pytest.fixture(scope="module")
def azure(azurite_server):
    st = AzureStorage(azurite_server.endpoint, azurite_server.account, azurite_server.key,
                      f"storage-{uuid.uuid4().hex[:8]}", block_size=4 << 20, max_concurrency=3)
    st.ensure_container()
    return st


@pytest.fixture(scope="module")
def gcs(gcs_server):
    st = GCSStorage(f"storage-{uuid.uuid4().hex[:8]}", endpoint=gcs_server.endpoint, credentials="anonymous",
                    chunk_size=4 << 20, max_concurrency=3)
    st.ensure_bucket()
    return st


@pytest.fixture(params=["fs", "memory", "s3", "azure", "gcs"])
def storage(request, tmp_path):
    if request.param == "fs":
        return FilesystemStorage(tmp_path, fsync=True)
    if request.param == "memory":
        return MemoryStorage()
    return request.getfixturevalue(request.param)


def test_put_get_ranges_list_delete(storage):
    ns = uuid.uuid4().hex[:6]
    # S3: 3 parts; Azure: 3 blocks; GCS: a resumable upload of 3 chunks
    data = os.urandom(12 << 20) if isinstance(storage, (S3Storage, AzureStorage, GCSStorage)) else os.urandom(1 << 20)
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


def test_azure_blocks_ranges_and_streamed_put(azure, azurite_server):
    ns = uuid.uuid4().hex[:6]
    data = os.urandom((9 << 20) + 5)
    azure.put(f"{ns}/x", [memoryview(data)[:100], data[100:]])  # a gather put over 3 blocks
    committed, uncommitted = azure.client.get_blob_client(azure.container, f"{ns}/x").get_block_list("all")
    assert [b.size for b in committed] == [4 << 20, 4 << 20, (1 << 20) + 5] and not uncommitted
    assert azure.size(f"{ns}/x") == len(data)
    assert azure.get(f"{ns}/x", 0, 10) == data[:10]  # offset 0 with a length: a ranged read
    assert azure.get(f"{ns}/x", 5 << 20) == data[5 << 20:]
    outs = [bytearray(3 << 20), bytearray(7), bytearray(5 << 20)]  # chunks of 4 MiB span the buffers
    azure.get_into(f"{ns}/x", 11, outs)
    assert b"".join(outs) == data[11:11 + (8 << 20) + 7]
    with pytest.raises(StorageError, match="short read") as err:
        azure.get(f"{ns}/x", len(data) - 2, 3)
    assert err.value.key == f"{ns}/x"
    azure.put_unsized(f"{ns}/s", (data[i:i + 300_000] for i in range(0, len(data), 300_000)))
    assert azure.get(f"{ns}/s") == data
    _unsized_contract(azure, ns, f"{ns}/s", data)
    by_string = AzureStorage.from_connection_string(azurite_server.connection_string, azure.container)
    assert by_string.list(f"{ns}/") == [f"{ns}/e", f"{ns}/s", f"{ns}/x"]


def test_azure_unreachable_account_retries_then_raises_storage_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: connection refused
    st = AzureStorage(f"http://127.0.0.1:{port}/devstoreaccount1", "devstoreaccount1", "a2V5", "ckpt",
                      retries=1, backoff_s=0.01, timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="after 2 attempts") as err:
        st.get("some/key")
    assert err.value.key == "some/key" and time.monotonic() - t0 < 5


def test_gcs_resumable_chunks_ranges_and_streamed_put(gcs, gcs_server):
    ns = uuid.uuid4().hex[:6]
    data = os.urandom((9 << 20) + 5)
    seen: list[tuple[str, int]] = []

    def hook(resp, *args, **kwargs):
        seen.append((resp.request.url, resp.status_code))

    gcs.client._http.hooks["response"].append(hook)
    try:
        gcs.put(f"{ns}/x", [memoryview(data)[:100], data[100:]])  # a gather put over 3 chunks
    finally:
        gcs.client._http.hooks["response"].remove(hook)
    # a resumable upload: the session, two chunks answered 308 (more expected), the last one completing it
    assert [status for url, status in seen if "uploadType=resumable" in url] == [200, 308, 308, 200]
    assert gcs.size(f"{ns}/x") == len(data)
    assert gcs.get(f"{ns}/x", 0, 10) == data[:10]  # offset 0 with a length: a ranged read
    assert gcs.get(f"{ns}/x", 5 << 20) == data[5 << 20:]
    assert gcs.get(f"{ns}/x", 1, len(data) - 1) == data[1:]  # 3 ranges read in parallel
    outs = [bytearray(3 << 20), bytearray(7), bytearray(5 << 20)]  # ranges of 4 MiB span the buffers
    gcs.get_into(f"{ns}/x", 11, outs)
    assert b"".join(outs) == data[11:11 + (8 << 20) + 7]
    with pytest.raises(StorageError, match="short read") as err:
        gcs.get(f"{ns}/x", len(data) - 2, 3)
    assert err.value.key == f"{ns}/x"
    with pytest.raises(StorageError, match="outside the object"):
        gcs.get(f"{ns}/x", len(data) + 10, 5)
    with pytest.raises(StorageError, match="no such key") as err:
        gcs.size(f"{ns}/missing")
    assert err.value.key == f"{ns}/missing"

    new = os.urandom(len(data))

    def streamed(check_old: bool):
        yield new[:5 << 20]  # one 4 MiB chunk sent, the rest buffered
        if check_old:
            assert gcs.get(f"{ns}/x") == data  # mid-upload, readers still see the old object
        yield new[5 << 20:]

    gcs.put_unsized(f"{ns}/x", streamed(True))
    assert gcs.get(f"{ns}/x") == new
    _unsized_contract(gcs, ns, f"{ns}/x", new)
    assert gcs.list(f"{ns}/") == [f"{ns}/e", f"{ns}/x"]

    absent = GCSStorage(f"absent-{ns}", endpoint=gcs_server.endpoint, credentials="anonymous", create_bucket=False)
    assert absent.list("") == [] and not absent.exists("k")
    absent.delete("k")
    with pytest.raises(StorageError, match="does not exist") as err:
        absent.put("k", b"v")
    assert err.value.key == "k"


def test_gcs_unreachable_endpoint_retries_then_raises_storage_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: connection refused
    st = GCSStorage("ckpt", endpoint=f"http://127.0.0.1:{port}", credentials="anonymous", retries=1,
                    backoff_s=0.01, timeout_s=2)  # a write first looks the bucket up: that failure names the key too
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="after 2 attempts") as err:
        st.get("some/key")
    assert err.value.key == "some/key"
    with pytest.raises(StorageError, match="after 2 attempts") as err:
        st.put("other/key", b"v" * 100)
    assert err.value.key == "other/key"
    with pytest.raises(StorageError, match="after 2 attempts") as err:
        st.put_unsized("third/key", iter([b"v" * 100]))
    assert err.value.key == "third/key" and time.monotonic() - t0 < 5


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


def _unsized_contract(storage, ns: str, key: str, old: bytes) -> None:
    """``put_unsized`` of nothing stores an empty object; a source that fails leaves ``key`` (holding
    ``old``) untouched."""
    storage.put_unsized(f"{ns}/e", iter([]))
    assert storage.get(f"{ns}/e") == b""

    def failing():
        yield old[:5 << 20]
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        storage.put_unsized(key, failing())
    assert storage.get(key) == old  # the old object is untouched
