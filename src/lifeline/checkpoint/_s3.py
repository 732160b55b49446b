"""S3 storage through the ``minio`` client: multipart upload, ranged GET, bounded concurrency, retries."""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

import urllib3
from minio import Minio
from minio.error import S3Error, ServerError

from lifeline.checkpoint._storage import buffer_views
from lifeline.errors import StorageError

if TYPE_CHECKING:
    from lifeline.checkpoint._s3_upload import S3Uploader

__all__ = ["S3Storage"]

T = TypeVar("T")

_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
                    "XMinioServerNotInitialized", "XMinioStorageFull", "OperationAborted"}
_MISSING_CODES = {"NoSuchKey", "NoSuchObject", "NoSuchBucket"}


class _Reader:
    """A file-like reader over a buffer or a list of buffers (minio reads parts from it)."""

    def __init__(self, data: Any) -> None:
        self._views = [v for v in buffer_views(data) if len(v)]
        self.length = sum(len(v) for v in self._views)

    def read(self, n: int = -1) -> bytes:
        want = self.length if n is None or n < 0 else n
        parts = []
        while want > 0 and self._views:
            head = self._views[0]
            take = head[:want]
            parts.append(take)
            want -= len(take)
            if len(take) == len(head):
                self._views.pop(0)
            else:
                self._views[0] = head[len(take):]
        self.length -= sum(len(p) for p in parts)
        return b"".join(parts)


class _StreamReader:
    """A file-like reader over an iterable of buffers consumed once (minio reads parts of an unknown
    total length from it)."""

    def __init__(self, pieces: Iterable[Any]) -> None:
        self._it = iter(pieces)
        self._head = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        parts = []
        want = n if n is not None and n >= 0 else None
        while want is None or want > 0:
            if not len(self._head):
                try:
                    self._head = memoryview(next(self._it)).cast("B")
                except StopIteration:
                    break
                continue
            take = self._head if want is None else self._head[:want]
            parts.append(bytes(take))
            self._head = self._head[len(take):]
            if want is not None:
                want -= len(take)
        return b"".join(parts)


class S3Storage:
    """Objects in an S3 bucket (MinIO or AWS) under keys ``<key>``.

    A :class:`~lifeline.checkpoint.Storage` with ``size`` (a HEAD request) and ``get_into``
    (a ranged GET streamed into the caller's buffers). Every failure, after the retries, is a
    :class:`StorageError` naming the key. Nothing is sent before the first operation.

    Args:
        endpoint: ``host:port`` of the S3 server.
        access_key, secret_key: credentials.
        bucket: bucket name; created when missing and ``create_bucket`` is true.
        secure: use TLS.
        part_size: multipart part size in bytes (>= 5 MiB); objects larger use a parallel
            multipart upload (S3 makes the object visible atomically on completion).
        max_concurrency: bound on parallel part uploads per ``put`` and on pooled connections.
        retries: attempts per operation on transient errors (connection errors, 5xx,
            ``SlowDown``), with exponential backoff from ``backoff_s`` seconds plus jitter.
        timeout_s: connect/read timeout per request, seconds.
    """

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        secure: bool = False,
        *,
        region: str | None = None,
        part_size: int = 16 << 20,
        max_concurrency: int = 8,
        retries: int = 5,
        backoff_s: float = 0.1,
        timeout_s: float = 60.0,
        create_bucket: bool = True,
    ) -> None:
        if part_size < 5 << 20:
            raise StorageError(f"part_size={part_size} is below S3's 5 MiB minimum")
        self.endpoint, self.bucket, self.part_size = endpoint, bucket, part_size
        self.secure, self.timeout_s = secure, timeout_s
        self._credentials = (access_key, secret_key)
        self.max_concurrency, self.retries, self.backoff_s = max_concurrency, retries, backoff_s
        http = urllib3.PoolManager(
            maxsize=max(4, 2 * max_concurrency),
            timeout=urllib3.Timeout(connect=min(10.0, timeout_s), read=timeout_s),
            retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0),
        )
        self.client = Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure,
                            region=region, http_client=http)
        self._bucket_checked = threading.Event()
        self._create_bucket = create_bucket

    def __repr__(self) -> str:
        return f"S3Storage({self.endpoint!r}, bucket={self.bucket!r})"

    def uploader(self, *, retries: int | None = None) -> S3Uploader:
        """A new :class:`~lifeline.checkpoint._s3_upload.S3Uploader` to this bucket with this storage's part
        size and parallelism (:class:`~lifeline.checkpoint.SupportsUploader`): parts straight from memory,
        crc32c-checked in transit; ``retries`` per request (``None``: this storage's)."""
        from lifeline.checkpoint._s3_upload import S3Uploader

        return S3Uploader(self.endpoint, *self._credentials, self.bucket, secure=self.secure,
                          part_size=self.part_size, concurrency=self.max_concurrency,
                          retries=self.retries if retries is None else retries, timeout_s=self.timeout_s)

    def _retry(self, what: str, key: str, fn: Callable[[], T]) -> T:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except S3Error as err:
                if err.code in _MISSING_CODES:
                    raise StorageError(f"{what}: no such key ({err.code})", key=key) from err
                if err.code not in _TRANSIENT_CODES or attempt == self.retries:
                    raise StorageError(f"{what} failed: {err.code}: {err.message}", key=key) from err
            except ValueError as err:  # minio's argument checks (bucket or object name)
                raise StorageError(f"{what}: {err}", key=key) from err
            except (ServerError, urllib3.exceptions.HTTPError, OSError) as err:
                if attempt == self.retries:
                    raise StorageError(f"{what} failed after {attempt + 1} attempts: {err}", key=key) from err
            time.sleep(delay * (1 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    def _ensure_bucket(self) -> None:
        if self._bucket_checked.is_set():
            return

        def check() -> None:
            if not self.client.bucket_exists(self.bucket):
                if not self._create_bucket:
                    raise StorageError(f"bucket {self.bucket!r} does not exist", key=self.bucket)
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as err:
                    if err.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

        self._retry("bucket check", self.bucket, check)
        self._bucket_checked.set()

    def put(self, key: str, data: Any) -> None:
        """Upload ``data`` (a buffer or a list of them, in order); parts of ``part_size`` go up
        ``max_concurrency`` at a time."""
        self._ensure_bucket()

        def upload() -> None:
            reader = _Reader(data)  # fresh per attempt
            self.client.put_object(self.bucket, key, reader, reader.length, part_size=self.part_size,
                                   num_parallel_uploads=self.max_concurrency)

        self._retry("put", key, upload)

    def put_unsized(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` (bytes-like objects, consumed once, in order) under ``key``
        as a multipart upload of ``part_size`` parts, holding one part in memory at a time: for data
        that is produced as it goes (streamed imports). Not :class:`~lifeline.checkpoint.SupportsPutStream`
        on purpose: saves of blobs in memory are faster through :meth:`put`'s parallel parts. The
        object appears only when the upload completes; an exception from ``pieces`` or the server
        aborts the upload, leaving nothing. Not retried: the pieces cannot be produced twice.

        Raises:
            StorageError: the upload failed (naming ``key``).
        """
        self._ensure_bucket()
        try:
            self.client.put_object(self.bucket, key, _StreamReader(pieces), -1, part_size=self.part_size)
        except (S3Error, ServerError, urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            raise StorageError(f"streamed put failed: {err}", key=key) from err

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """A ranged GET of ``[offset, offset + length)``."""
        if length == 0:
            return b""

        def fetch() -> bytes:
            resp = self.client.get_object(self.bucket, key, offset=offset, length=length or 0)
            try:
                data = resp.read()
            finally:
                resp.close()
                resp.release_conn()
            if length is not None and len(data) != length:
                raise StorageError(f"short read: {len(data)} of {length} bytes at {offset}", key=key)
            return data

        return self._retry("get", key, fetch)

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """A ranged GET streamed straight into ``out`` (a writable buffer, or a list of them in order)."""
        views = buffer_views(out)
        total = sum(len(v) for v in views)
        if not total:
            return

        def fetch() -> None:
            resp = self.client.get_object(self.bucket, key, offset=offset, length=total)
            try:
                for mv in views:
                    pos = 0
                    while pos < len(mv):
                        n = resp.readinto(mv[pos:])
                        if not n:
                            raise urllib3.exceptions.ProtocolError(f"short read at {offset + pos}")
                        pos += n
            finally:
                resp.close()
                resp.release_conn()

        self._retry("get", key, fetch)

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes (a HEAD request); :class:`StorageError` when it is missing."""
        return int(self._retry("stat", key, lambda: self.client.stat_object(self.bucket, key)).size)

    def exists(self, key: str) -> bool:
        def stat() -> bool:
            try:
                self.client.stat_object(self.bucket, key)
                return True
            except S3Error as err:
                if err.code in _MISSING_CODES:
                    return False
                raise

        return self._retry("stat", key, stat)

    def list(self, prefix: str) -> list[str]:
        def ls() -> list[str]:
            try:
                return sorted(o.object_name for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True))
            except S3Error as err:
                if err.code == "NoSuchBucket":
                    return []
                raise

        return self._retry("list", prefix, ls)

    def delete(self, key: str) -> None:
        self._retry("delete", key, lambda: self.client.remove_object(self.bucket, key))
