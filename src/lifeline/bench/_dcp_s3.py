"""A minimal fsspec filesystem over the minio client, so torch.distributed.checkpoint's FsspecWriter and
FsspecReader can run against MinIO in the checkpoint benchmark (s3fs would pin python-dateutil < 3,
which the kubernetes client refuses).

Paths are ``lminio://<bucket>/<key>``. Writes buffer the whole file and upload it on close
through :class:`lifeline.checkpoint.S3Storage` (parallel multipart); reads are ranged GETs
through fsspec's buffered file (read-ahead cache).
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem, register_implementation
from fsspec.spec import AbstractBufferedFile

from lifeline.checkpoint import S3Storage
from lifeline.errors import StorageError

__all__ = ["register"]


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
        return storage.get(key, start, end - start)


class MinioFileSystem(AbstractFileSystem):
    """fsspec filesystem ``lminio://bucket/key`` (endpoint and credentials set by :func:`register`)."""

    protocol = "lminio"
    endpoint = access_key = secret_key = ""
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


def register(endpoint: str, access_key: str, secret_key: str) -> None:
    """Register ``lminio://`` with fsspec for this endpoint and credentials."""
    cls = type("BoundMinioFileSystem", (MinioFileSystem,),
               {"endpoint": endpoint, "access_key": access_key, "secret_key": secret_key, "cachable": False})
    register_implementation("lminio", cls, clobber=True)
