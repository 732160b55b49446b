"""Google Cloud Storage through the ``google-cloud-storage`` client: resumable uploads, ranged GET, bounded retries.

Writes follow GCS's JSON API upload protocols (https://cloud.google.com/storage/docs/uploads-downloads,
.../performing-resumable-uploads): at most 8 MiB (the client library's threshold) as one multipart
upload, more as a resumable upload: a session, chunks of ``chunk_size`` bytes, and the object appears,
whole, only when the last chunk completes it (an unfinished session leaves nothing visible and expires
after a week). Objects are immutable: an upload replaces one atomically. Every upload carries its
crc32c, checked by GCS before the commit. Limits: 5 TiB per object; chunks a multiple of 256 KiB.

The client library is imported with this module, which the package imports only on first use
(``lifeline.checkpoint.GCSStorage``); install it with the ``gcs`` extra.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

import requests
import urllib3
from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import Conflict, Forbidden, GoogleAPICallError, NotFound, RequestRangeNotSatisfiable
import google.auth
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage as gcs
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
from google.cloud.storage.fileio import BlobWriter
from google.oauth2 import service_account

from lifeline.checkpoint._storage import buffer_views
from lifeline.errors import StorageError

__all__ = ["GCSStorage"]

T = TypeVar("T")

CHUNK_MULTIPLE = 256 << 10  # bytes: every chunk of a resumable upload but the last is a multiple of it
_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_CONTENT_TYPE = "application/octet-stream"
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _status(err: BaseException) -> int | None:
    """The HTTP status of a failed request's error, None when it got no answer."""
    if isinstance(err, GoogleAPICallError):
        return err.code
    return getattr(getattr(err, "response", None), "status_code", None) if isinstance(err, InvalidResponse) else None


def _no_answer(err: BaseException) -> bool:
    """The request got no (complete) answer: connection refused or reset, a timeout, a cut-off body."""
    if isinstance(err, auth_exceptions.TransportError):  # the credentials' refresh: the cause is inside
        return bool(err.args) and isinstance(err.args[0], BaseException) and _no_answer(err.args[0])
    return isinstance(err, (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                            ConnectionError, http.client.HTTPException, urllib3.exceptions.ProtocolError))


def _transient(err: BaseException) -> bool:
    """Worth another attempt: no answer, or 408, 429 or a 5xx."""
    return _no_answer(err) or _status(err) in _TRANSIENT_STATUS


def _message(err: BaseException) -> str:
    text = str(getattr(err, "message", None) or err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


class _Retry:
    """Bounded retries: ``retry(func)`` calls ``func`` at most ``retries + 1`` times while it fails with an error
    ``worth(err)`` accepts, sleeping ``backoff_s * 2**n`` s plus up to 100% jitter between; the error given up
    on records the attempts (``_lifeline_attempts``). The library calls its retries so (resumable uploads)."""

    def __init__(self, retries: int, backoff_s: float, worth: Callable[[BaseException], bool] = _transient) -> None:
        self.retries, self.backoff_s, self.worth = max(0, retries), backoff_s, worth

    def __call__(self, func: Callable[..., T], on_error: Any = None) -> Callable[..., T]:
        def run(*args: Any, **kwargs: Any) -> T:
            for attempt in itertools.count(1):
                try:
                    return func(*args, **kwargs)
                except Exception as err:
                    if attempt > self.retries or not self.worth(err):
                        err._lifeline_attempts = attempt  # type: ignore[attr-defined]
                        raise
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            raise AssertionError("unreachable")

        return run


class _Source:
    """A reader over a buffer or a list of them: the library reads an upload's chunks from it (and seeks
    back to resend one); each attempt of a ``put`` starts a new one at 0."""

    def __init__(self, views: list[memoryview]) -> None:
        self._views, self._pos, self._size = views, 0, sum(len(v) for v in views)

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int) -> int:  # back to a chunk's start, to send it again
        self._pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        out = b"".join(_window(self._views, self._pos, end - self._pos))
        self._pos = max(self._pos, end)
        return out


class _Sink:
    """A writer filling a list of buffers one after the other (a ranged download streams into it)."""

    def __init__(self, views: list[memoryview]) -> None:
        self._views, self.written = views, 0

    def write(self, data: Any) -> int:
        src, done = memoryview(data).cast("B"), 0
        for view in _window(self._views, self.written, len(src)):
            view[:] = src[done:done + len(view)]
            done += len(view)
        if done != len(src):
            raise ValueError(f"the download overruns the buffers ({self.written + len(src)} bytes)")
        self.written += done
        return done


def _window(views: list[memoryview], start: int, length: int) -> list[memoryview]:
    """Slices (no copies) of ``views`` covering bytes ``[start, start + length)`` of their concatenation."""
    out, pos = [], 0
    for v in views:
        lo, hi = max(start, pos), min(start + length, pos + len(v))
        if lo < hi:
            out.append(v[lo - pos:hi - pos])
        pos += len(v)
    return out


class _Upload(BlobWriter):
    """A resumable upload fed by ``write`` and committed only by :meth:`finish`; ``close`` (which ``io`` also
    calls on a collected writer) abandons it: an unfinished session commits nothing (it expires in a week)."""

    def finish(self) -> None:
        super().close()  # the last chunk: the object appears

    def close(self) -> None:
        pass


class GCSStorage:
    """Objects in a Google Cloud Storage bucket (or the fake-gcs-server emulator) under names ``<key>``.

    A :class:`~lifeline.checkpoint.Storage` with ``size`` (the object's metadata), ``get_into`` (ranged
    GETs streamed into the caller's buffers) and ``put_unsized`` (a resumable upload fed as the data is
    produced). Every failure, after the retries, is a :class:`StorageError` naming the key (a missing
    key, an unreachable endpoint, unusable credentials). Nothing is sent, and no credentials are looked
    up, before the first operation; a bad ``chunk_size`` or ``max_concurrency`` raises at once.

    Args:
        bucket: the bucket (created on first write when missing and ``create_bucket`` is true).
        endpoint: the JSON API's base URL, e.g. fake-gcs-server's ``http://127.0.0.1:4443``; None: Google's.
        credentials: ``"anonymous"`` (an emulator), the path of a service-account JSON key file, a
            ``google.auth`` credentials object, or None: application default credentials
            (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's login, the metadata server).
        project: the project new buckets are created in; None: the credentials' (none, anonymously).
        chunk_size: bytes per request of a resumable upload (objects over 8 MiB), a multiple of 256 KiB;
            also the range of parallel reads. Memory: one chunk per upload (two while ``put`` joins it).
        max_concurrency: ranges read in parallel per ``get_into``; pooled connections.
        retries: retries per request on transient errors (no answer, 408, 429, 5xx), backing off
            exponentially from ``backoff_s`` seconds plus jitter: ``retries + 1`` attempts at most. ``put``
            retries the whole upload (its data is in memory); ``put_unsized`` resends a chunk only when it
            got no answer (its pieces are produced once).
        timeout_s: connect (at most 10 s) and read timeout per request, seconds.
        create_bucket: create a missing bucket on the first write (:meth:`ensure_bucket`).
    """

    def __init__(self, bucket: str, *, endpoint: str | None = None, credentials: Any = None,
                 project: str | None = None, chunk_size: int = 16 << 20, max_concurrency: int = 8,
                 retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 60.0,
                 create_bucket: bool = True) -> None:
        if chunk_size <= 0 or chunk_size % CHUNK_MULTIPLE:
            raise StorageError(f"chunk_size={chunk_size} must be a positive multiple of 256 KiB", key=bucket)
        if max_concurrency < 1:
            raise StorageError(f"max_concurrency={max_concurrency} must be >= 1", key=bucket)
        self.bucket, self.endpoint = bucket, endpoint.rstrip("/") if endpoint else None
        self.project, self.chunk_size, self.max_concurrency = project, chunk_size, max_concurrency
        self.retries, self.backoff_s, self.create_bucket = retries, backoff_s, create_bucket
        self._credentials, self._timeout = credentials, (min(10.0, timeout_s), timeout_s)
        self._retry, self._lock, self._bucket_checked = _Retry(retries, backoff_s), threading.Lock(), threading.Event()
        self._client: gcs.Client | None = None

    def __repr__(self) -> str:
        return f"GCSStorage({self.bucket!r}, endpoint={self.endpoint or 'https://storage.googleapis.com'!r})"

    @property
    def client(self) -> gcs.Client:
        """The library's client, made on first use (:class:`StorageError`, naming the bucket, when credentials fail)."""
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> gcs.Client:
        creds, project = self._credentials, self.project
        try:
            if creds == "anonymous":
                creds = AnonymousCredentials()
            elif isinstance(creds, str):
                creds = service_account.Credentials.from_service_account_file(creds, scopes=_SCOPES)
                project = project or creds.project_id
            elif creds is None:
                creds, found = google.auth.default(scopes=_SCOPES)
                project = project or found
        except (auth_exceptions.GoogleAuthError, OSError, ValueError) as err:
            raise StorageError(f"GCS credentials for bucket {self.bucket!r}: {err}", key=self.bucket) from err
        session = AuthorizedSession(creds)
        adapter = requests.adapters.HTTPAdapter(pool_connections=2, pool_maxsize=max(10, 2 * self.max_concurrency),
                                                max_retries=0)  # retries are ours (_Retry)
        for scheme in ("http://", "https://"):
            session.mount(scheme, adapter)
        options = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
        return gcs.Client(project=project, credentials=creds, _http=session, client_options=options)

    @property
    def _bucket(self) -> gcs.Bucket:
        return self.client.bucket(self.bucket)

    def _call(self, what: str, key: str, fn: Callable[[], T], *, retry: bool = True,
              missing: str = "no such key") -> T:
        """``fn()``, retried (``retry``) on transient errors, with the library's errors as :class:`StorageError`
        naming ``key`` (``missing``: what a 404 means)."""
        try:
            self.client  # noqa: B018 - the credentials first: their error names the key too
            return (self._retry(fn) if retry else fn)()
        except StorageError as err:
            if err.key == key:
                raise
            raise StorageError(f"{what}: {err.message}", key=key) from err
        except RequestRangeNotSatisfiable as err:
            raise StorageError(f"{what}: the range lies outside the object (HTTP 416)", key=key) from err
        except (GoogleAPICallError, InvalidResponse) as err:
            status, n = _status(err), int(getattr(err, "_lifeline_attempts", 1))
            if status == 404:
                raise StorageError(f"{what}: {missing} ({_message(err)})", key=key) from err
            raise StorageError(f"{what} failed: HTTP {status}: {_message(err)}"
                               + (f" (after {n} attempts)" if n > 1 else ""), key=key) from err
        except DataCorruption as err:
            raise StorageError(f"{what}: the data changed in transit (checksum mismatch): {_message(err)}",
                               key=key) from err
        except (auth_exceptions.GoogleAuthError, requests.RequestException, ConnectionError,
                http.client.HTTPException, urllib3.exceptions.HTTPError) as err:  # no answer, or no credentials
            n = int(getattr(err, "_lifeline_attempts", 1))
            raise StorageError(f"{what} failed after {n} attempt{'s' if n > 1 else ''}: {_message(err)}",
                               key=key) from err
        except (ValueError, OSError) as err:  # the library's argument and stream checks
            raise StorageError(f"{what} failed: {err}", key=key) from err

    def ensure_bucket(self, *, key: str | None = None) -> None:
        """Create the bucket when it does not exist (credentials that may not look buckets up are taken to mean
        it does; the write then tells). :class:`StorageError` naming ``key`` (default: the bucket) when refused."""
        def create() -> None:
            try:
                found = self.client.lookup_bucket(self.bucket, timeout=self._timeout, retry=None)
            except Forbidden:
                return
            if found is None:
                with contextlib.suppress(Conflict):  # Conflict: created meanwhile
                    self.client.create_bucket(self.bucket, timeout=self._timeout, retry=None)

        self._call("create bucket", key or self.bucket, create)
        self._bucket_checked.set()

    def put(self, key: str, data: Any) -> None:
        """Store ``data`` (a bytes-like object, or a list of them gathered in order) under ``key``,
        atomically: at most 8 MiB as one multipart upload, more as a resumable upload in chunks of
        ``chunk_size`` bytes read from the caller's buffers. A failed attempt is retried from its first
        byte (a new session). Raises :class:`StorageError` (naming ``key``) when a request failed after
        its retries; the old object, if any, is then untouched."""
        if self.create_bucket and not self._bucket_checked.is_set():
            self.ensure_bucket(key=key)  # a failure names the key written
        views = [v for v in buffer_views(data) if len(v)]
        total = sum(len(v) for v in views)

        def upload() -> None:
            blob = self._bucket.blob(key, chunk_size=self.chunk_size)
            blob.upload_from_file(_Source(views), size=total, content_type=_CONTENT_TYPE, checksum="crc32c",
                                  timeout=self._timeout, retry=None)

        self._call("put", key, upload, missing=f"bucket {self.bucket!r} does not exist")

    def put_unsized(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` (bytes-like objects, consumed once, in order) under
        ``key``: one resumable upload, a chunk of ``chunk_size`` bytes sent as soon as it fills (one
        chunk in memory), the last one completing the object
        (:class:`~lifeline.checkpoint.SupportsPutUnsized`). An exception from ``pieces`` or the service
        abandons the session and leaves ``key`` untouched. A chunk that got no answer is sent again (at
        most ``retries`` times); the pieces are not produced twice. Raises :class:`StorageError` (naming
        ``key``) when a request failed."""
        if self.create_bucket and not self._bucket_checked.is_set():
            self.ensure_bucket(key=key)  # a failure names the key written
        missing = f"bucket {self.bucket!r} does not exist"
        writer = _Upload(self._bucket.blob(key), chunk_size=self.chunk_size, ignore_flush=True,
                         retry=_Retry(self.retries, self.backoff_s, _no_answer), content_type=_CONTENT_TYPE,
                         checksum="crc32c", timeout=self._timeout)
        for piece in pieces:  # an exception here, or from a request, abandons the session
            view = memoryview(piece).cast("B")
            if len(view):
                self._call("put chunk", key, lambda: writer.write(view), retry=False, missing=missing)
        self._call("put", key, writer.finish, retry=False, missing=missing)

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``key`` (to the end when ``length`` is None): a ranged
        GET (whenever ``length`` is given, offset 0 included); more than ``chunk_size`` bytes are read
        as ``chunk_size`` ranges ``max_concurrency`` at a time. Raises :class:`StorageError` when ``key``
        is missing, the range lies outside it, or a request failed."""
        if length == 0:
            return b""
        if length is not None and length > self.chunk_size:  # in parallel ranges
            self.get_into(key, offset, out := bytearray(length))
            return bytes(out)
        start = None if offset == 0 and length is None else offset  # a whole read asks for no range
        end = None if length is None else offset + length - 1

        def fetch() -> bytes:
            data = self._bucket.blob(key).download_as_bytes(start=start, end=end, raw_download=True, checksum=None,
                                                             timeout=self._timeout, retry=None)
            if length is not None and len(data) != length:
                raise StorageError(f"short read: {len(data)} of {length} bytes at {offset}", key=key)
            return data

        return self._call("get", key, fetch)

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them in order) with the bytes of ``key`` from
        ``offset`` (bytes): ranged GETs of at most ``chunk_size`` bytes, ``max_concurrency`` at a time,
        each streamed straight into its part of the buffers (a failed one is read again whole).
        Raises :class:`StorageError` when ``key`` is missing, the range lies outside it, or a request failed."""
        views = buffer_views(out)
        total = sum(len(v) for v in views)
        if not total:
            return
        ranges = [(offset + s, _window(views, s, n), n) for s in range(0, total, self.chunk_size)
                  for n in [min(self.chunk_size, total - s)]]
        if len(ranges) == 1:
            return self._read_range(key, *ranges[0])
        with ThreadPoolExecutor(min(self.max_concurrency, len(ranges)), thread_name_prefix="gcs-get") as pool:
            list(pool.map(lambda r: self._read_range(key, *r), ranges))  # the first error cancels the rest

    def _read_range(self, key: str, offset: int, views: list[memoryview], length: int) -> None:
        def fetch() -> None:
            sink = _Sink(views)  # each attempt writes from the range's first byte again
            self._bucket.blob(key).download_to_file(sink, start=offset, end=offset + length - 1, raw_download=True,
                                                    checksum=None, timeout=self._timeout, retry=None)
            if sink.written != length:
                raise StorageError(f"short read: {sink.written} of {length} bytes at {offset}", key=key)

        self._call("get", key, fetch)

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes (its metadata); :class:`StorageError` when it is missing."""
        blob = self._call("stat", key, lambda: self._bucket.get_blob(key, timeout=self._timeout, retry=None))
        if blob is None:
            raise StorageError("stat: no such key", key=key)
        return int(blob.size)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists; :class:`StorageError` when the service cannot be asked."""
        return bool(self._call("stat", key, lambda: self._bucket.blob(key).exists(timeout=self._timeout, retry=None)))

    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted (none when the bucket does not exist)."""
        def ls() -> list[str]:
            try:
                return sorted(b.name for b in self.client.list_blobs(
                    self.bucket, prefix=prefix or None, fields="items(name),nextPageToken",
                    timeout=self._timeout, retry=None))
            except NotFound:
                return []

        return self._call("list", prefix, ls)

    def delete(self, key: str) -> None:
        """Remove ``key`` (its live version); no error when it is absent."""
        def rm() -> None:
            with contextlib.suppress(NotFound):
                self._bucket.blob(key).delete(timeout=self._timeout, retry=None)

        self._call("delete", key, rm)

