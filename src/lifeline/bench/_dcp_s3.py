"""A minimal fsspec filesystem over the minio client, so torch.distributed.checkpoint's FsspecWriter and
FsspecReader can run against MinIO in the checkpoint benchmark (s3fs would pin python-dateutil < 3,
which the kubernetes client refuses).

Paths are ``lminio://<bucket>/<key>``. Writes buffer the whole file and upload it on close
through :class:`lifeline.checkpoint.S3Storage` (parallel multipart); reads are ranged GETs
through fsspec's buffered file (read-ahead cache). :data:`FETCHED` counts the bytes those GETs
returned in this process (``FETCHED[0]``), so a bench can report what DCP read against what it needed.
"""

from __future__ import annotations

import threading
from typing import Any

from fsspec import AbstractFileSystem, register_implementation
from fsspec.spec import AbstractBufferedFile

from lifeline.checkpoint import S3Storage
from lifeline.errors import StorageError

__all__ = ["register", "FETCHED"]

FETCHED = [0]
"""Bytes returned by ranged GETs of ``lminio://`` files in this process (reset it by assigning ``FETCHED[0] = 0``)."""
_fetched_lock = threading.Lock()


class _File(AbstractBufferedFile):
    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        if not final:
            return False  # keep buffering: one object per file
        self.fs._storage(self.path)[0].put(self.fs._key(self.path), self.buffer.getbuffer())
        return True

    def _fetch_range(self, start: int, end: int) -> bytes:
        storage, key = self.fs._storage(self.path)
        end = min(end, self.size)  # a block cache asks for whole blocks, past the end of the file
        if end <= start:
            return b""
        data = storage.get(key, start, end - start)
        with _fetched_lock:
            FETCHED[0] += len(data)
        return data


class MinioFileSystem(AbstractFileSystem):
    """fsspec filesystem ``lminio://bucket/key`` (endpoint and credentials set by :func:`register`)."""

    protocol = "lminio"
    endpoint = access_key = secret_key = ""
    read_cache = "readahead"
    root_marker = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stores: dict[str, S3Storage] = {}

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        path = path[len("lminio://"):] if path.startswith("lminio://") else path
        return path.strip("/")

    def _storage(self, path: str) -> tuple[S3Storage, str]:
        bucket = self._strip_protocol(path).split("/", 1)[0]
        if bucket not in self._stores:
            self._stores[bucket] = S3Storage(self.endpoint, self.access_key, self.secret_key, bucket, max_concurrency=8)
        return self._stores[bucket], self._key(path)

    def _key(self, path: str) -> str:
        parts = self._strip_protocol(path).split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> _File:
        if self.read_cache == "blockcache":  # every block fetched once while an item's zip footer and head are read
            return _File(self, path, mode, block_size=block_size or 8 * 2**20, autocommit=autocommit,
                         cache_type="blockcache", cache_options=cache_options or {"maxblocks": 16}, **kwargs)
        return _File(self, path, mode, block_size=block_size or 32 * 2**20, autocommit=autocommit,
                     cache_type="readahead", cache_options=cache_options, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        storage, key = self._storage(path)
        name = self._strip_protocol(path)
        if key:
            try:
                stat = storage.client.stat_object(storage.bucket, key)
                return {"name": name, "size": stat.size, "type": "file"}
            except Exception:  # noqa: BLE001 - not a file: maybe a prefix
                pass
        if storage.list(key + "/" if key else ""):
            return {"name": name, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        storage, key = self._storage(path)
        bucket = storage.bucket
        prefix = key + "/" if key else ""
        names = sorted({prefix + k[len(prefix):].split("/", 1)[0] for k in storage.list(prefix)})
        out = [{"name": f"{bucket}/{n}", "size": 0, "type": "file"} for n in names]
        return out if detail else [o["name"] for o in out]

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass

    def rm_file(self, path: str) -> None:
        storage, key = self._storage(path)
        storage.delete(key)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        for p in [path] if isinstance(path, str) else path:
            self.rm_file(p)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, k1 = self._storage(path1)
        dst, k2 = self._storage(path2)
        try:
            dst.put(k2, src.get(k1))
        except StorageError as err:
            raise FileNotFoundError(path1) from err
        src.delete(k1)

    rename = mv


def register(endpoint: str, access_key: str, secret_key: str, read_cache: str = "readahead") -> None:
    """Register ``lminio://`` with fsspec for this endpoint and credentials.

    ``read_cache``: ``"readahead"`` (32 MiB read-ahead, like s3fs's default cache) or ``"blockcache"``
    (8 MiB blocks, 16 kept per open file: DCP's torch.load of an item reads its zip footer before its
    head, which makes a read-ahead cache fetch again; with blocks each byte is fetched about once).
    """
    if read_cache not in ("readahead", "blockcache"):
        raise ValueError(f"read_cache must be 'readahead' or 'blockcache', got {read_cache!r}")
    cls = type("BoundMinioFileSystem", (MinioFileSystem,),
               {"endpoint": endpoint, "access_key": access_key, "secret_key": secret_key, "cachable": False,
                "read_cache": read_cache})
    register_implementation("lminio", cls, clobber=True)
