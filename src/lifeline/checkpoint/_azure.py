"""Azure Blob Storage through the ``azure-storage-blob`` SDK: block blobs, ranged GET, bounded retries.

Writes follow Azure's block-blob protocol (REST docs "Put Block" and "Put Block List",
https://learn.microsoft.com/rest/api/storageservices/put-block and .../put-block-list): the
blocks of an object are staged in parallel (uncommitted, invisible to readers) and one Put
Block List commits them, which replaces the blob atomically; an object of at most one block
goes up as one Put Blob. Uncommitted blocks of a failed write are garbage-collected by the
service (after a week). Limits: at most 50,000 blocks of at most 4000 MiB per blob.

The SDK is imported with this module, which the package imports only on first use
(``lifeline.checkpoint.AzureStorage``); install it with the ``azure`` extra.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, TypeVar

import requests
from azure.core.exceptions import (AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobBlock, BlobServiceClient, ExponentialRetry
from urllib3.util.retry import Retry

from lifeline.checkpoint._storage import buffer_views
from lifeline.errors import StorageError

__all__ = ["AzureStorage"]

T = TypeVar("T")

MAX_BLOCKS = 50_000
"""Azure's limit on the committed blocks of one block blob."""
MAX_BLOCK_SIZE = 4000 << 20
"""Azure's limit on one block (Put Block), bytes."""


class _Retry(ExponentialRetry):
    """The SDK's retry policy with a short exponential backoff (``backoff_s * 2**n``, plus up to 100%
    jitter) that records, on the error (or the failed response) it gives up on, how many attempts
    were made: ``_lifeline_attempts``."""

    def __init__(self, retries: int, backoff_s: float) -> None:
        # every counter at ``retries``: the SDK stops when any of them runs out
        super().__init__(retry_total=retries, retry_connect=retries, retry_read=retries, retry_status=retries,
                         initial_backoff=0, random_jitter_range=0)
        self.backoff_s = backoff_s

    def get_backoff_time(self, settings: dict[str, Any]) -> float:  # settings["count"]: 1 before the first retry
        return self.backoff_s * 2 ** max(0, settings["count"] - 1) * (1 + random.random())

    def increment(self, settings, request, response=None, error=None) -> bool:  # type: ignore[override]
        more = super().increment(settings, request, response=response, error=error)
        if not more:
            target = error if error is not None else response
            if target is not None:
                target._lifeline_attempts = settings["count"] + 1
        return more


def _attempts(err: BaseException) -> int:
    """Attempts the SDK made before ``err`` (1 when it did not retry)."""
    return int(getattr(err, "_lifeline_attempts", 0) or getattr(getattr(err, "response", None),
                                                                 "_lifeline_attempts", 0) or 1)


def _code(err: HttpResponseError) -> str:
    code = err.error_code or getattr(err, "reason", None) or f"HTTP {err.status_code}"
    return str(getattr(code, "value", code))


class _Sink:
    """A seekable writable stream over a buffer or a list of them (the SDK's parallel download
    writes its chunks into it, each at its own position)."""

    def __init__(self, views: list[memoryview]) -> None:
        self._views, self._pos = views, 0
        self._starts = [0]
        for v in views:
            self._starts.append(self._starts[-1] + len(v))

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else self._starts[-1] + pos)
        return self._pos

    def write(self, data: Any) -> int:
        src = memoryview(data).cast("B")
        if self._pos + len(src) > self._starts[-1]:
            raise ValueError(f"download overruns the buffer: {self._pos + len(src)} > {self._starts[-1]} bytes")
        done = 0
        for start, view in zip(self._starts, self._views):
            end = start + len(view)
            if end <= self._pos or not len(src) - done:
                continue
            at = self._pos - start
            n = min(len(view) - at, len(src) - done)
            view[at:at + n] = src[done:done + n]
            done += n
            self._pos += n
        return done


def _blocks(views: list[memoryview], block: int) -> Iterator[Callable[[], Any]]:
    """Thunks returning the consecutive ``block``-byte blocks of ``views`` (the last one shorter): a
    block inside one view is a slice of it (no copy), one that spans views is joined when called."""
    pieces: list[memoryview] = []
    have = 0
    for v in views:
        while len(v):
            take = v[:block - have]
            pieces.append(take)
            have += len(take)
            v = v[len(take):]
            if have == block:
                yield _thunk(pieces)
                pieces, have = [], 0
    if pieces:
        yield _thunk(pieces)


def _thunk(pieces: list[memoryview]) -> Callable[[], Any]:
    return (lambda: pieces[0]) if len(pieces) == 1 else (lambda: b"".join(pieces))


class AzureStorage:
    """Block blobs in an Azure Blob Storage container (or the Azurite emulator) under names ``<key>``.

    A :class:`~lifeline.checkpoint.Storage` with ``size`` (Get Blob Properties), ``get_into`` (a
    ranged Get Blob written straight into the caller's buffers) and ``put_unsized`` (blocks staged
    as the data is produced). Every failure, after the retries, is a :class:`StorageError` naming
    the key (a missing key and an unreachable account included). Nothing is sent before the first
    operation.

    Args:
        account_url: the blob endpoint of the account, e.g. ``https://<account>.blob.core.windows.net``
            (the default, built from ``account_name``) or Azurite's ``http://127.0.0.1:10000/devstoreaccount1``.
        account_name, account_key: the shared-key credentials (``account_key``: base64, as the portal
            shows it); ``account_key=None``: anonymous access (or a SAS token in ``account_url``).
        container: the container (created on first write when missing and ``create_container`` is true).
        block_size: bytes per staged block (Put Block), <= 4000 MiB; objects of at most one block go
            up as one Put Blob. Grown for an object that would need more than 50,000 blocks. Also the
            chunk size of parallel ranged reads.
        max_concurrency: blocks staged (and ranges read) in parallel per call; pooled connections.
        retries: retries per request on transient errors (connection errors, timeouts, 408, 5xx),
            the SDK's retry policy with exponential backoff from ``backoff_s`` seconds plus jitter:
            ``retries + 1`` attempts at most.
        timeout_s: connect (at most 10 s) and read timeout per request, seconds.
        create_container: create a missing container on the first write (:meth:`ensure_container`).

    Raises:
        StorageError: a bad ``block_size`` or ``max_concurrency``.
    """

    def __init__(self, account_url: str | None, account_name: str, account_key: str | None, container: str, *,
                 block_size: int = 16 << 20, max_concurrency: int = 8, retries: int = 3, backoff_s: float = 0.2,
                 timeout_s: float = 60.0, create_container: bool = True) -> None:
        if not 0 < block_size <= MAX_BLOCK_SIZE:
            raise StorageError(f"block_size={block_size} is outside Azure's (0, 4000 MiB] block size")
        if max_concurrency < 1:
            raise StorageError(f"max_concurrency={max_concurrency} must be >= 1")
        self.account_url = (account_url or f"https://{account_name}.blob.core.windows.net").rstrip("/")
        self.account_name, self.container, self.block_size = account_name, container, block_size
        self.max_concurrency, self.retries, self.backoff_s = max_concurrency, retries, backoff_s
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=2, pool_maxsize=max(10, 2 * max_concurrency),
                                                max_retries=Retry(total=False, redirect=False, raise_on_status=False))
        for scheme in ("http://", "https://"):
            session.mount(scheme, adapter)
        transport = RequestsTransport(session=session, connection_timeout=min(10.0, timeout_s), read_timeout=timeout_s)
        credential = {"account_name": account_name, "account_key": account_key} if account_key else None
        self.client = BlobServiceClient(
            self.account_url, credential=credential, transport=transport, retry_policy=_Retry(retries, backoff_s),
            max_single_put_size=block_size, max_block_size=block_size,
            max_single_get_size=block_size, max_chunk_get_size=block_size)
        self._container = self.client.get_container_client(container)
        self._create_container = create_container
        self._container_checked = threading.Event()

    @classmethod
    def from_connection_string(cls, connection_string: str, container: str, **options: Any) -> AzureStorage:
        """An :class:`AzureStorage` for the account of an Azure connection string (``AccountName=...;
        AccountKey=...;BlobEndpoint=...`` or ``...;EndpointSuffix=...``); ``options`` as the constructor's.

        Raises:
            StorageError: the string is malformed or holds no account key.
        """
        try:
            parsed = BlobServiceClient.from_connection_string(connection_string)
        except (ValueError, AzureError) as err:
            raise StorageError(f"bad Azure connection string: {err}", key=container) from err
        key = getattr(parsed.credential, "account_key", None)
        if not key:
            raise StorageError("the Azure connection string holds no AccountKey", key=container)
        return cls(parsed.url, parsed.account_name, key, container, **options)

    def __repr__(self) -> str:
        return f"AzureStorage({self.account_url!r}, container={self.container!r})"

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` with the SDK's errors as :class:`StorageError` naming ``key`` (retries are the SDK's)."""
        try:
            return fn()
        except ResourceNotFoundError as err:
            code = _code(err)
            if code == "ContainerNotFound":
                raise StorageError(f"{what}: container {self.container!r} does not exist ({code})", key=key) from err
            raise StorageError(f"{what}: no such key ({code})", key=key) from err
        except HttpResponseError as err:
            n = _attempts(err)
            message = str(err.message or err).splitlines()[0]
            raise StorageError(f"{what} failed: {_code(err)}: {message}"
                               + (f" (after {n} attempts)" if n > 1 else ""), key=key) from err
        except AzureError as err:  # no answer: connection refused or reset, timeouts
            n = _attempts(err)
            raise StorageError(f"{what} failed after {n} attempt{'s' if n > 1 else ''}: {err}", key=key) from err
        except (ValueError, OSError) as err:  # the SDK's argument checks; the transport
            raise StorageError(f"{what} failed: {err}", key=key) from err

    def ensure_container(self) -> None:
        """Create the container when it does not exist (Create Container; an existing one is kept).

        Raises:
            StorageError: the account refused or could not be reached (naming the container).
        """
        def create() -> None:
            try:
                self._container.create_container()
            except ResourceExistsError:
                pass

        self._call("create container", self.container, create)
        self._container_checked.set()

    def _before_write(self) -> None:
        if self._create_container and not self._container_checked.is_set():
            self.ensure_container()

    def _block_ids(self, n: int) -> list[str]:
        """``n`` block ids of one write: equal length (as Azure requires within a blob) and unique to
        the write, so concurrent writes of one key never commit each other's blocks."""
        nonce = uuid.uuid4().hex
        return [f"{nonce}-{i:06d}" for i in range(n)]

    def put(self, key: str, data: Any) -> None:
        """Store ``data`` (a bytes-like object, or a list of them gathered in order) under ``key``,
        atomically: at most ``block_size`` bytes as one Put Blob, more as blocks of ``block_size``
        bytes staged ``max_concurrency`` at a time (Put Block) and committed by one Put Block List.

        Raises:
            StorageError: a request failed after its retries (naming ``key``); the old object, if
                any, is untouched.
        """
        self._before_write()
        views = [v for v in buffer_views(data) if len(v)]
        total = sum(len(v) for v in views)
        block = max(self.block_size, math.ceil(total / MAX_BLOCKS))
        if block > MAX_BLOCK_SIZE:
            raise StorageError(f"put of {total} bytes exceeds Azure's largest block blob", key=key)
        blob = self._container.get_blob_client(key)
        if total <= block:
            body = b"".join(views)
            self._call("put", key, lambda: blob.upload_blob(body, length=total, overwrite=True))
            return
        thunks = list(_blocks(views, block))
        ids = self._block_ids(len(thunks))
        with ThreadPoolExecutor(min(self.max_concurrency, len(thunks)), thread_name_prefix="azure-block") as pool:
            futures = [pool.submit(self._call, "put block", key, lambda i=i, t=t: blob.stage_block(i, t()))
                       for i, t in zip(ids, thunks)]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        self._call("put block list", key, lambda: blob.commit_block_list([BlobBlock(i) for i in ids]))

    def put_unsized(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` (bytes-like objects, consumed once, in order) under
        ``key``: blocks of ``block_size`` bytes staged one after the other as they fill (one block
        in memory at a time), then one Put Block List (:class:`~lifeline.checkpoint.SupportsPutUnsized`).
        The object appears only on the commit; an exception from ``pieces`` or the service leaves
        ``key`` untouched. Each request is retried; the pieces are not produced twice.

        Raises:
            StorageError: a request failed after its retries, or the data needs more than 50,000
                blocks (naming ``key``).
        """
        self._before_write()
        blob = self._container.get_blob_client(key)
        nonce, ids, buf = uuid.uuid4().hex, [], bytearray()

        def stage(data: Any) -> None:
            if len(ids) == MAX_BLOCKS:
                raise StorageError(f"streamed put exceeds {MAX_BLOCKS} blocks of {self.block_size} bytes", key=key)
            ids.append(f"{nonce}-{len(ids):06d}")
            self._call("put block", key, lambda: blob.stage_block(ids[-1], data))

        for piece in pieces:
            view = memoryview(piece).cast("B")
            while len(view):
                take = view[:self.block_size - len(buf)]
                if not buf and len(take) == self.block_size:
                    stage(take)  # a whole block inside one piece: no copy
                else:
                    buf += take
                    if len(buf) == self.block_size:
                        stage(bytes(buf))
                        buf.clear()
                view = view[len(take):]
        if buf:
            stage(bytes(buf))
        self._call("put block list", key, lambda: blob.commit_block_list([BlobBlock(i) for i in ids]))

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``key`` (to the end when ``length`` is None): a ranged
        Get Blob (whenever ``length`` is given, offset 0 included), large ranges read in
        ``block_size`` chunks ``max_concurrency`` at a time.

        Raises:
            StorageError: ``key`` is missing, the range lies outside it, or a request failed.
        """
        if length == 0:
            return b""
        blob = self._container.get_blob_client(key)

        # a whole read asks for no range: the SDK then reads an empty blob too (a range of one is a 416)
        start = None if offset == 0 and length is None else offset

        def fetch() -> bytes:
            data = blob.download_blob(offset=start, length=length, max_concurrency=self.max_concurrency).readall()
            if length is not None and len(data) != length:
                raise StorageError(f"short read: {len(data)} of {length} bytes at {offset}", key=key)
            return data

        return self._call("get", key, fetch)

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them in order) with the bytes of ``key`` from
        ``offset`` (bytes): a ranged Get Blob written straight into them.

        Raises:
            StorageError: ``key`` is missing, the range lies outside it, or a request failed.
        """
        views = buffer_views(out)
        total = sum(len(v) for v in views)
        if not total:
            return
        blob = self._container.get_blob_client(key)

        def fetch() -> None:
            n = blob.download_blob(offset=offset, length=total, max_concurrency=self.max_concurrency).readinto(
                _Sink(views))
            if n != total:
                raise StorageError(f"short read: {n} of {total} bytes at {offset}", key=key)

        self._call("get", key, fetch)

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes (Get Blob Properties); :class:`StorageError` when it is missing."""
        return int(self._call("stat", key, lambda: self._container.get_blob_client(key).get_blob_properties()).size)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists; :class:`StorageError` when the account cannot be asked."""
        return bool(self._call("stat", key, lambda: self._container.get_blob_client(key).exists()))

    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted (none when the container does not exist)."""
        def ls() -> list[str]:
            try:
                return sorted(b.name for b in self._container.list_blobs(name_starts_with=prefix or None))
            except ResourceNotFoundError:
                return []

        return self._call("list", prefix, ls)

    def delete(self, key: str) -> None:
        """Remove ``key`` and its snapshots (Delete Blob); no error when it is absent."""
        def rm() -> None:
            try:
                self._container.get_blob_client(key).delete_blob(delete_snapshots="include")
            except ResourceNotFoundError:
                pass

        self._call("delete", key, rm)
