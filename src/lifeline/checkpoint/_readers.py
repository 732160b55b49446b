"""Blob readers: what the loader reads rank blobs through, and the one over a :class:`Storage`.

A :class:`BlobReader` serves byte ranges of one job's rank blobs (from storage, sidecar memory,
peers). Like a storage it may offer more, each a runtime-checkable protocol the loader checks
once per load: :class:`SupportsReadInto` (fill the caller's buffers, no copy),
:class:`SupportsReadPiecesInto` (stream many ranges of one blob) and
:class:`~lifeline.checkpoint.ReadTuning` (how it is read fastest).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Protocol, runtime_checkable

from lifeline.checkpoint._keys import blob_key
from lifeline.checkpoint._storage import ReadTuning, Storage, SupportsGetInto, SupportsGetPiecesInto, buffer_views

__all__ = ["BlobReader", "SupportsReadInto", "SupportsReadPiecesInto", "StorageBlobReader"]


@runtime_checkable
class BlobReader(Protocol):
    """Serves byte ranges of rank blobs of one job's checkpoints (storage, sidecar memory, peers).

    ``read`` raises :class:`StorageError` when the range cannot be served. A reader may also
    offer :class:`SupportsReadInto`, :class:`SupportsReadPiecesInto` and
    :class:`~lifeline.checkpoint.ReadTuning`: with ``read_piece`` (bytes, or None) the loader
    reads in pieces of that size and verifies each piece's checksum blocks right after it is
    read, while they are cache-hot; ``read_threads`` (int, or None) caps its reader threads (a
    local disk streams fastest as one sequential reader).
    """

    def read(self, step: int, rank: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of rank ``rank``'s blob at ``step``."""


@runtime_checkable
class SupportsReadInto(Protocol):
    """A blob reader that fills the caller's memory (the loader then reads straight into the target
    tensors where it can)."""

    def read_into(self, step: int, rank: int, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them filled one after the other) with rank
        ``rank``'s blob at ``step`` from byte ``offset``; :class:`StorageError` when it cannot."""


@runtime_checkable
class SupportsReadPiecesInto(Protocol):
    """A blob reader that streams many ranges of one blob in one call (the pipelined load's reader
    thread uses it; see ``_read_stream``)."""

    def read_pieces_into(self, step: int, rank: int, pieces: Iterable[tuple[int, Any]]) -> Iterator[int]:
        """Fill each ``(offset, out)`` of ``pieces`` in order (``out`` as in
        :meth:`SupportsReadInto.read_into`), yielding each piece's end offset (bytes) once it is
        filled; :class:`StorageError` when a piece cannot be read."""


class StorageBlobReader:
    """A :class:`BlobReader` over a :class:`Storage` at ``<prefix>/<job>/<step>/rank-<r>.bin``.

    It reads into the caller's memory (:class:`SupportsReadInto`, :class:`SupportsReadPiecesInto`)
    whatever the storage; without the storage's ``get_into``/``get_pieces_into`` through a
    copy of what ``get`` returns. ``read_piece`` and ``read_threads`` are the storage's
    (:class:`~lifeline.checkpoint.ReadTuning`), None when it has none. The storage's
    capabilities are looked up once, here. Errors are the storage's :class:`StorageError`.
    """

    def __init__(self, storage: Storage, prefix: str, job: str) -> None:
        self.storage, self.prefix, self.job = storage, prefix, job
        tuning = storage if isinstance(storage, ReadTuning) else None
        self.read_piece: int | None = tuning.read_piece if tuning is not None else None
        self.read_threads: int | None = tuning.read_threads if tuning is not None else None
        self._get_into = storage.get_into if isinstance(storage, SupportsGetInto) else None
        self._get_pieces_into = storage.get_pieces_into if isinstance(storage, SupportsGetPiecesInto) else None

    def _key(self, step: int, rank: int) -> str:
        return blob_key(self.prefix, self.job, step, rank)

    def read(self, step: int, rank: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of rank ``rank``'s blob at ``step``."""
        return self.storage.get(self._key(step, rank), offset, length)

    def read_pieces_into(self, step: int, rank: int, pieces: Iterable[tuple[int, Any]]) -> Iterator[int]:
        """Fill each ``(offset, out)`` of ``pieces`` in order (``out`` as in :meth:`read_into`), yielding
        each piece's end offset (bytes) once it is filled; one open file for all of them when the
        storage offers ``get_pieces_into`` (the filesystem)."""
        if self._get_pieces_into is not None:
            yield from self._get_pieces_into(self._key(step, rank), pieces)
            return
        for offset, out in pieces:
            self.read_into(step, rank, offset, out)
            yield offset + sum(len(v) for v in buffer_views(out))

    def read_into(self, step: int, rank: int, offset: int, out: Any) -> None:
        """Fill ``out`` (a writable buffer, or a list of them filled one after the other) from ``offset``."""
        key = self._key(step, rank)
        if self._get_into is not None:
            self._get_into(key, offset, out)
            return
        views = buffer_views(out)
        data = self.storage.get(key, offset, sum(len(v) for v in views))
        pos = 0
        for v in views:
            v[:] = data[pos : pos + len(v)]
            pos += len(v)
