"""One resolver (``storage_from_uri(uri, StorageOptions)``) and capabilities declared by protocols, on real
storage: the filesystem, MinIO, Azurite and fake-gcs-server."""

from __future__ import annotations

import os
import uuid

import pytest

from lifeline.checkpoint import (
    SCHEMES,
    FilesystemStorage,
    MemoryStorage,
    S3Storage,
    StorageOptions,
    SupportsPutUnsized,
    SupportsUploader,
    storage_from_uri,
    uri_scheme,
)
from lifeline.errors import StorageError


def test_a_path_a_file_uri_and_memory_resolve_without_options(tmp_path):
    for uri in (str(tmp_path), f"file://{tmp_path}"):
        fs, prefix = storage_from_uri(uri)
        assert isinstance(fs, FilesystemStorage) and fs.root == str(tmp_path) and prefix == "" and fs.fsync
    fs, _ = storage_from_uri(str(tmp_path), StorageOptions(fsync=False, tuning={"direct": False}))
    assert not fs.fsync and fs.direct is False
    mem, prefix = storage_from_uri("memory://a/b/")
    assert isinstance(mem, MemoryStorage) and prefix == "a/b"
    assert {uri_scheme("/x"), uri_scheme("S3://b"), uri_scheme("az://c/p"), uri_scheme("gs://b")} == {
        "file", "s3", "az", "gs"}


@pytest.mark.parametrize("uri, fragment", [
    ("gopher://host/x", "unknown storage scheme 'gopher'"),
    ("s3:///prefix", "needs a bucket"),
    ("gs:///prefix", "needs a bucket"),
    ("file://", "needs a path"),
])
def test_a_uri_that_cannot_be_used_is_a_storage_error_naming_it(uri, fragment):
    with pytest.raises(StorageError, match=fragment) as err:
        storage_from_uri(uri, StorageOptions(endpoint="127.0.0.1:1", access_key="a", secret_key="b"))
    assert err.value.key == uri
    if "unknown" in fragment:
        assert all(f"{s}://" in str(err.value) for s in SCHEMES)


def test_an_option_the_backend_does_not_take_is_named(tmp_path):
    with pytest.raises(StorageError, match="colour"):
        storage_from_uri(str(tmp_path), StorageOptions(tuning={"colour": "red"}))


def test_s3_options_come_from_the_options_or_the_environment(minio_server, monkeypatch):
    for name in ("LIFELINE_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageError, match="LIFELINE_S3_ENDPOINT"):
        storage_from_uri("s3://resolve/x")
    bucket = f"resolve-{uuid.uuid4().hex[:8]}"
    options = StorageOptions(endpoint=minio_server.endpoint, access_key=minio_server.access_key,
                             secret_key=minio_server.secret_key, retries=1, tuning={"part_size": 5 << 20})
    s3, prefix = storage_from_uri(f"s3://{bucket}/a/b", options)
    assert isinstance(s3, S3Storage) and (s3.bucket, prefix, s3.retries, s3.part_size) == (bucket, "a/b", 1, 5 << 20)
    assert "secret" not in repr(options) and minio_server.secret_key not in repr(options)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio_server.secret_key)
    s3, _ = storage_from_uri(f"s3://{bucket}", StorageOptions(endpoint=minio_server.endpoint,
                                                               access_key=minio_server.access_key))
    s3.put("k", b"v")
    assert s3.get("k") == b"v"


def test_capabilities_are_declared_and_the_s3_uploader_writes_what_the_storage_reads(minio_server, tmp_path):
    """The sidecar persists through any ``SupportsUploader`` storage; S3 declares it, the filesystem does not."""
    fs, _ = storage_from_uri(str(tmp_path))
    assert not isinstance(fs, SupportsUploader) and not isinstance(fs, SupportsPutUnsized)
    s3, _ = storage_from_uri(f"s3://up-{uuid.uuid4().hex[:8]}", StorageOptions(
        endpoint=minio_server.endpoint, access_key=minio_server.access_key, secret_key=minio_server.secret_key,
        tuning={"part_size": 5 << 20}))
    assert isinstance(s3, SupportsUploader) and isinstance(s3, SupportsPutUnsized)
    data = os.urandom((11 << 20) + 3)  # three parts
    up = s3.uploader(retries=0)
    try:
        s3.put("seed", b"")  # the bucket exists before the uploader's first request
        up.put("blob", memoryview(data))
    finally:
        up.close()
    assert s3.get("blob") == data and s3.size("blob") == len(data)


def test_az_uris_resolve_to_azure_blob_storage(azurite_server, monkeypatch):
    from lifeline.checkpoint import AzureStorage

    for name in ("LIFELINE_AZURE_ACCOUNT", "LIFELINE_AZURE_KEY", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageError, match="account and its key"):
        storage_from_uri("az://ckpt/x")
    with pytest.raises(StorageError, match="needs a container"):
        storage_from_uri("az:///x", StorageOptions(access_key="a", secret_key="b"))
    options = StorageOptions(endpoint=azurite_server.endpoint, access_key=azurite_server.account,
                             secret_key=azurite_server.key, retries=1, tuning={"block_size": 1 << 20})
    az, prefix = storage_from_uri(f"az://resolve-{uuid.uuid4().hex[:8]}/run/1/", options)
    assert isinstance(az, AzureStorage) and prefix == "run/1" and az.retries == 1 and az.block_size == 1 << 20
    data = os.urandom((3 << 20) + 5)
    az.put(f"{prefix}/blob", memoryview(data))
    assert az.get(f"{prefix}/blob", 0, 10) == data[:10] and az.list(prefix) == [f"{prefix}/blob"]
    assert not isinstance(az, SupportsUploader) and isinstance(az, SupportsPutUnsized)


def test_gs_uris_resolve_to_google_cloud_storage(gcs_server, monkeypatch, tmp_path):
    from lifeline.checkpoint import GCSStorage

    monkeypatch.delenv("LIFELINE_GCS_ENDPOINT", raising=False)
    bucket = f"resolve-{uuid.uuid4().hex[:8]}"
    options = StorageOptions(endpoint=gcs_server.endpoint, retries=1, tuning={"chunk_size": 1 << 20})
    gs, prefix = storage_from_uri(f"gs://{bucket}/run/1/", options)
    assert isinstance(gs, GCSStorage)
    assert (gs.bucket, prefix, gs.retries, gs.chunk_size) == (bucket, "run/1", 1, 1 << 20)
    data = os.urandom((9 << 20) + 5)  # over 8 MiB: a resumable upload
    gs.put(f"{prefix}/blob", memoryview(data))
    assert gs.get(f"{prefix}/blob", 0, 10) == data[:10] and gs.list(prefix) == [f"{prefix}/blob"]
    assert not isinstance(gs, SupportsUploader) and isinstance(gs, SupportsPutUnsized)
    # the environment names the endpoint too, as host:port (plain HTTP unless `secure`)
    monkeypatch.setenv("LIFELINE_GCS_ENDPOINT", gcs_server.endpoint.removeprefix("http://"))
    again, _ = storage_from_uri(f"gs://{bucket}")
    assert again.endpoint == gcs_server.endpoint and again.size(f"{prefix}/blob") == len(data)
    # real GCS with a service-account key file that is not there: a StorageError naming the key, no request sent
    monkeypatch.delenv("LIFELINE_GCS_ENDPOINT")
    google, _ = storage_from_uri(f"gs://{bucket}", StorageOptions(secret_key=str(tmp_path / "absent.json")))
    with pytest.raises(StorageError, match="GCS credentials") as err:
        google.get("k")
    assert err.value.key == "k" and google.endpoint is None
