"""The storage backends of this machine (files, process memory).

Both satisfy :class:`~lifeline.checkpoint.Storage`; see ``_storage`` for the optional
capabilities each offers. The S3 backend is in ``_s3``; URIs are resolved in ``_resolve``.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any, Iterable, Iterator

from lifeline.checkpoint._direct import enable_direct, probe_direct, write_direct, write_pipelined
from lifeline.checkpoint._storage import buffer_views
from lifeline.errors import StorageError

__all__ = ["FilesystemStorage", "MemoryStorage"]


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage key {key!r}: use relative '/'-separated names", key=key)
    return key


WRITE_BATCH = 1 << 20
"""Bytes gathered into one ``writev`` by ``FilesystemStorage.put`` (through the page cache)."""

DIRECT_MIN = 1 << 20
"""Objects of fewer bytes are written through the page cache even when direct I/O is on."""


def _writev_all(fd: int, views: list[memoryview]) -> None:
    while views:
        n = os.writev(fd, views[:1024])
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _write_all(fd: int, pieces: Iterable[Any]) -> None:
    """Write ``pieces`` in order, one ``writev`` per ~:data:`WRITE_BATCH` bytes (or 1024 pieces)."""
    batch: list[memoryview] = []
    batched = 0
    for piece in pieces:
        view = memoryview(piece).cast("B")
        if not len(view):
            continue
        batch.append(view)
        batched += len(view)
        if batched >= WRITE_BATCH or len(batch) >= 1024:
            _writev_all(fd, batch)
            batch, batched = [], 0
    _writev_all(fd, batch)


def _range(size: int, offset: int, length: int | None, key: str) -> tuple[int, int]:
    end = size if length is None else offset + length
    if offset < 0 or end > size or end < offset:
        raise StorageError(f"range [{offset}, {end}) outside object of {size} bytes", key=key)
    return offset, end


class FilesystemStorage:
    """Objects as files under ``root``.

    ``put`` writes a temporary file in the target directory, fsyncs it (``fsync=True``),
    renames it over the key and fsyncs the directory, so a crash leaves either the old
    object or the new one, durable on return. ``fsync=False`` keeps the atomic rename but
    leaves durability to the OS (page cache), for tests and tmpfs.

    ``direct`` (default: the value of ``fsync``) writes objects of :data:`DIRECT_MIN` bytes
    and more with ``O_DIRECT`` (see ``_direct``): straight from the caller's memory when it
    is page-aligned (a sidecar arena slot), else through page-aligned bounce buffers, by a
    writer thread that overlaps the device with the producer; nothing enters the page cache,
    so a save is never throttled by the cache another save filled. A filesystem without
    ``O_DIRECT`` (tmpfs before Linux 6.6; probed once per instance with a 4 KiB write) is written through the
    page cache. Reads are always buffered.

    A :class:`Storage` with every optional capability: ``size``, ``get_into``, ``get_pieces_into``,
    ``put_stream`` and the read tuning (:attr:`read_piece`, :attr:`read_threads`). Every failure
    is a :class:`StorageError` naming the key.
    """

    read_piece = 1 << 20
    """Bytes the loader reads at a time before verifying them (a local read is cheap to split;
    the kernel's readahead keeps the device busy while the piece is checksummed)."""
    read_threads = 1
    """Reader threads the loader runs: one sequential stream reads a local disk fastest (measured:
    several threads' interleaved streams defeat the readahead; ``docs/checkpoint.md``)."""

    def __init__(self, root: str | os.PathLike, fsync: bool = True, direct: bool | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync
        self.direct = fsync if direct is None else direct
        self._direct_ok: bool | None = None  # probed on the first direct write

    def __repr__(self) -> str:
        return f"FilesystemStorage({self.root!r}, fsync={self.fsync}, direct={self.direct})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *_check_key(key).split("/"))

    def put(self, key: str, data: Any) -> None:
        views = buffer_views(data)
        self._put(key, views, self.direct and sum(len(v) for v in views) >= DIRECT_MIN, stream=False)

    def put_stream(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` (bytes-like objects, consumed once, in order) under ``key``.

        Each piece is handed to a writer thread as soon as it is produced, so a producer can
        checksum a piece while it is cache-hot (see ``_persist``) and the next while this one
        is written. Same atomicity and durability as :meth:`put`. An
        exception from ``pieces`` aborts the write: the temporary file is removed, ``key`` is
        untouched. With ``direct`` the pieces are written with ``O_DIRECT`` (see the class).
        """
        self._put(key, pieces, self.direct, stream=True)

    def _put(self, key: str, pieces: Iterable[Any], direct: bool, stream: bool) -> None:
        path = self._path(key)
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            os.makedirs(directory, exist_ok=True)
            if direct and self._direct_ok is None:
                self._direct_ok = probe_direct(directory)
            direct = direct and bool(self._direct_ok)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                if direct and enable_direct(fd):
                    write_direct(fd, pieces)
                elif stream:
                    write_pipelined(fd, pieces)
                else:
                    _write_all(fd, pieces)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if self.fsync:
                dfd = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except BaseException as err:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(err, OSError):
                raise StorageError(f"write failed: {err}", key=key) from err
            raise

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        buf = bytearray(self._size(key) - offset if length is None else length)
        self.get_into(key, offset, buf)
        return bytes(buf)

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes; :class:`StorageError` when it is missing."""
        return self._size(key)

    def _size(self, key: str) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except OSError as err:
            raise StorageError(f"cannot read: {err.strerror}", key=key) from err

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """Read bytes of ``key`` from ``offset`` straight into ``out``: a writable buffer, or a list of
        them filled one after the other (one ``preadv`` scatter read)."""
        for _ in self.get_pieces_into(key, [(offset, out)]):
            pass

    def get_pieces_into(self, key: str, pieces: Iterable[tuple[int, Any]]) -> Iterator[int]:
        """Fill each ``(offset, out)`` of ``pieces`` in order (``out`` as in :meth:`get_into`) from one
        open file, yielding the end offset (bytes) of each piece once it is filled: the loader's
        reader thread streams a blob piece by piece while another thread verifies the pieces read.

        Raises :class:`StorageError` naming the key when the file is missing or a range lies
        outside it (before that piece is read).
        """
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except OSError as err:
            raise StorageError(f"cannot read: {err.strerror}", key=key) from err
        try:
            size = os.fstat(fd).st_size
            for offset, out in pieces:
                views = [v for v in buffer_views(out) if len(v)]
                total = sum(len(v) for v in views)
                _range(size, offset, total, key)
                pos = 0
                while views:
                    n = os.preadv(fd, views[:1024], offset + pos)
                    if n <= 0:
                        raise StorageError(f"short read at byte {offset + pos}", key=key)
                    pos += n
                    while views and n >= len(views[0]):
                        n -= len(views[0])
                        views.pop(0)
                    if n:
                        views[0] = views[0][n:]
                yield offset + total
        except OSError as err:
            raise StorageError(f"read failed: {err}", key=key) from err
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def list(self, prefix: str) -> list[str]:
        out = []
        base = self.root
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, base)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if prefix and not (rel.startswith(prefix) or prefix.startswith(rel)):
                dirnames[:] = []
                continue
            for name in filenames:
                key = rel + name
                if key.startswith(prefix) and not name.endswith(".tmp"):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as err:
            raise StorageError(f"delete failed: {err}", key=key) from err


class MemoryStorage:
    """Objects in process memory (the sidecar's L0/L1 holdings; a unit-test double for the others).

    A :class:`Storage` with ``size`` and ``get_into``; thread-safe. A missing key or a range
    outside an object is a :class:`StorageError` naming the key.
    """

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryStorage({len(self._objects)} objects)"

    def put(self, key: str, data: Any) -> None:
        blob = b"".join(buffer_views(data))
        with self._lock:
            self._objects[_check_key(key)] = blob

    def _obj(self, key: str) -> bytes:
        with self._lock:
            obj = self._objects.get(key)
        if obj is None:
            raise StorageError("no such key", key=key)
        return obj

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes; :class:`StorageError` when it is missing."""
        return len(self._obj(key))

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        obj = self._obj(key)
        start, end = _range(len(obj), offset, length, key)
        return obj[start:end]

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """Copy bytes of ``key`` from ``offset`` into ``out`` (a writable buffer or a list of them)."""
        views = buffer_views(out)
        obj = self._obj(key)
        start, end = _range(len(obj), offset, sum(len(v) for v in views), key)
        src = memoryview(obj)
        for v in views:
            v[:] = src[start : start + len(v)]
            start += len(v)

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._objects

    def list(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(k for k in self._objects if k.startswith(prefix))

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)

    def keys(self) -> Iterator[str]:
        """Every key, sorted (a snapshot)."""
        return iter(self.list(""))
