"""The storage contract: the :class:`Storage` protocol and the optional capabilities a backend may add.

Every backend (:class:`FilesystemStorage`, :class:`MemoryStorage`, :class:`S3Storage`,
:class:`AzureStorage`, :class:`GCSStorage`, or your own) satisfies :class:`Storage`. The fast paths of the checkpoint
code each need one more capability, a small protocol of its own: code that can use one checks it once, with
``isinstance`` against the protocol (they are all runtime-checkable), when it sets up (a
reader, a save, a verification), and falls back to the plain :class:`Storage` methods when
the backend lacks it. Which backend offers what: :class:`SupportsSize` and
:class:`SupportsGetInto` all five; :class:`SupportsGetPiecesInto`, :class:`SupportsPutStream`
and :class:`ReadTuning` the filesystem only; :class:`SupportsPutUnsized` S3, Azure and GCS;
:class:`SupportsUploader` S3.

``isinstance`` looks for the capability's members on the object: a wrapper that forwards
to another storage through ``__getattr__`` is seen to have them on Python 3.11 but not from
3.12 on (``isinstance`` then looks members up statically); define the forwarded members
on the wrapper itself.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

__all__ = ["Storage", "SupportsSize", "SupportsGetInto", "SupportsGetPiecesInto", "SupportsPutStream",
           "SupportsPutUnsized", "SupportsUploader", "Uploader", "ReadTuning", "buffer_views"]


@runtime_checkable
class Storage(Protocol):
    """A flat key -> bytes store. Keys are ``/``-separated relative paths.

    ``put`` is atomic: a reader sees the whole object or none of it. Every failure is a
    :class:`StorageError` naming the key (a missing key included).
    """

    def put(self, key: str, data: Any) -> None:
        """Store ``data`` (a bytes-like object, or a list of them gathered in order) under ``key``,
        replacing it atomically."""

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``key`` (to the end when ``length`` is None)."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix``, sorted."""

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error when absent)."""


@runtime_checkable
class SupportsSize(Protocol):
    """A storage that tells an object's length without reading it (``verify_checkpoint`` uses it)."""

    def size(self, key: str) -> int:
        """Length of ``key`` in bytes; :class:`StorageError` when it is missing."""


@runtime_checkable
class SupportsGetInto(Protocol):
    """A storage that reads into the caller's memory, without an intermediate copy."""

    def get_into(self, key: str, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them filled one after the other) with the
        bytes of ``key`` from ``offset`` (bytes); :class:`StorageError` when the range lies outside
        the object or it is missing."""


@runtime_checkable
class SupportsGetPiecesInto(Protocol):
    """A storage that streams many ranges of one object in one go (the filesystem: one open file,
    so the kernel's readahead follows the reader)."""

    def get_pieces_into(self, key: str, pieces: Iterable[tuple[int, Any]]) -> Iterator[int]:
        """Fill each ``(offset, out)`` of ``pieces`` in order (``out`` as in
        :meth:`SupportsGetInto.get_into`), yielding the end offset (bytes) of each piece once it
        is filled; :class:`StorageError` naming the key when the object is missing or a range lies
        outside it."""


@runtime_checkable
class SupportsPutStream(Protocol):
    """A storage that writes an object from an iterable of buffers as they are produced (the fused
    checksum-and-write save path uses it: see ``_persist``)."""

    def put_stream(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` (bytes-like objects, consumed once, in order) under
        ``key``, atomically as :meth:`Storage.put`. An exception from ``pieces`` aborts the write
        and leaves ``key`` untouched."""


@runtime_checkable
class SupportsPutUnsized(Protocol):
    """A storage that writes an object of unknown length from buffers as they are produced, holding
    one upload part at a time (S3's multipart upload; the streamed import uses it). Unlike
    :class:`SupportsPutStream` it is not the fused save path: each part is a copy."""

    def put_unsized(self, key: str, pieces: Iterable[Any]) -> None:
        """Store the concatenation of ``pieces`` under ``key``, atomically as :meth:`Storage.put`;
        a failure leaves no object behind."""


@runtime_checkable
class Uploader(Protocol):
    """Uploads whole objects for the sidecar's persister (see :class:`SupportsUploader`)."""

    def put(self, key: str, data: Any) -> None:
        """Store ``data`` (a buffer or a list of them, in order) under ``key`` atomically."""

    def close(self) -> None:
        """Release the connections and threads."""


@runtime_checkable
class SupportsUploader(Protocol):
    """A storage with an upload path faster than its :meth:`Storage.put` for large buffers taken
    straight from memory (S3: parts from the arena, unsigned payloads, crc32c in transit). The
    sidecar persists through it when the storage declares it, through ``put`` otherwise."""

    def uploader(self, *, retries: int | None = None) -> Uploader:
        """A new :class:`Uploader` to the same place; ``retries`` per request (``None``: the storage's)."""


@runtime_checkable
class ReadTuning(Protocol):
    """How a storage (or a blob reader) is read fastest; the loader follows it. Both are required,
    None meaning no preference.

    ``read_piece``: bytes to read at a time before verifying them (their checksum blocks are
    then checked while still in the CPU cache); None: a read is served in one call.
    ``read_threads``: the most reader threads worth running (a local disk streams fastest as
    one sequential reader); None: as many as the caller asks for.
    """

    @property
    def read_piece(self) -> int | None:
        """Bytes to read at a time before verifying them, or None."""

    @property
    def read_threads(self) -> int | None:
        """The most reader threads worth running, or None."""


def buffer_views(out: Any) -> list[memoryview]:
    """``out`` (a buffer, or a list of them) as a list of byte (``"B"``) memoryviews, in order."""
    return [memoryview(b).cast("B") for b in (out if isinstance(out, list) else [out])]
