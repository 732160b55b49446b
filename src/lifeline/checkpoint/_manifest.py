"""The manifest: the versioned, checkpoint-wide record written last, as the commit marker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from lifeline.checkpoint._layout import Layout
from lifeline.checkpoint._shard_metadata import BytesMeta, ChunkMeta, ShardMetadata
from lifeline.errors import FormatVersionError, ManifestError

__all__ = ["FORMAT", "FORMAT_VERSION", "ChunkRef", "TensorRecord", "Manifest"]

FORMAT = "lifeline-checkpoint"
"""The ``format`` field of every manifest."""
FORMAT_VERSION = 1
"""The checkpoint format version this Lifeline writes and reads (a manifest of another is refused)."""


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """A stored copy of a chunk: which rank's blob holds it, and the chunk itself."""

    rank: int
    chunk: ChunkMeta


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """A logical tensor of the checkpoint: dtype, global shape, the saving pattern and every stored chunk."""

    dtype: str
    shape: tuple[int, ...]
    pattern: Mapping[str, Any]
    chunks: tuple[ChunkRef, ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    """The commit marker of a checkpoint: format version, job, step, layout, blobs, tensors, byte entries.

    ``blobs[r]`` is the size in bytes of rank ``r``'s blob; ``bytes_entries[r][key]`` the
    byte entries of rank ``r``.
    """

    job: str
    step: int
    layout: Layout
    blobs: tuple[int, ...]
    tensors: Mapping[str, TensorRecord]
    bytes_entries: Mapping[int, Mapping[str, BytesMeta]]
    version: int = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_shards(cls, job: str, step: int, layout: Layout, shards: Sequence[ShardMetadata]) -> Manifest:
        """Merge every rank's metadata. Raises :class:`ManifestError` naming the rank or tensor that disagrees."""
        layout.validate()
        by_rank = {s.rank: s for s in shards}
        if sorted(by_rank) != list(range(layout.world_size)) or len(shards) != layout.world_size:
            raise ManifestError(
                f"need one shard per rank 0..{layout.world_size - 1}, got ranks {sorted(s.rank for s in shards)}",
                job=job, step=step,
            )
        tensors: dict[str, TensorRecord] = {}
        for r in range(layout.world_size):
            s = by_rank[r]
            if s.job != job or s.step != step or s.layout != layout:
                raise ManifestError(f"shard of rank {r} is for job={s.job} step={s.step} layout={s.layout}",
                                    job=job, step=step, rank=r)
            for t in s.tensors:
                refs = tuple(ChunkRef(r, c) for c in t.chunks)
                prev = tensors.get(t.fqn)
                if prev is None:
                    tensors[t.fqn] = TensorRecord(t.dtype, t.global_shape, t.pattern, refs)
                elif prev.dtype != t.dtype or prev.shape != t.global_shape:
                    raise ManifestError(
                        f"tensor {t.fqn!r}: rank {r} has {t.dtype}{list(t.global_shape)}, "
                        f"another rank {prev.dtype}{list(prev.shape)}", job=job, step=step, rank=r, key=t.fqn)
                else:
                    tensors[t.fqn] = TensorRecord(prev.dtype, prev.shape, prev.pattern, prev.chunks + refs)
        return cls(
            job=job, step=int(step), layout=layout,
            blobs=tuple(by_rank[r].nbytes for r in range(layout.world_size)), tensors=tensors,
            bytes_entries={r: {b.key: b for b in by_rank[r].bytes_entries} for r in range(layout.world_size)},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": self.version, "job": self.job, "step": self.step,
            "layout": self.layout.to_dict(), "blobs": list(self.blobs),
            "tensors": {
                fqn: {"dtype": t.dtype, "shape": list(t.shape), "pattern": dict(t.pattern),
                      "chunks": [[ref.rank] + ref.chunk.to_list() for ref in t.chunks]}
                for fqn, t in sorted(self.tensors.items())
            },
            "bytes": {str(r): {k: [b.byte_offset, b.byte_length, b.crc32c] for k, b in sorted(e.items())}
                      for r, e in sorted(self.bytes_entries.items())},
            "extra": dict(self.extra),
        }

    def to_json(self) -> str:
        """Compact JSON text (the ``manifest.json`` object)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any], *, key: str | None = None) -> Manifest:
        """Parse a manifest. Raises :class:`FormatVersionError` for an unknown version and
        :class:`ManifestError` (naming ``key``) for anything unreadable or inconsistent."""
        try:
            d = text if isinstance(text, Mapping) else json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ManifestError(f"manifest is not valid JSON: {err}", key=key) from err
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest", key=key)
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise FormatVersionError(
                f"manifest format version {version!r} is not supported (this Lifeline reads version "
                f"{FORMAT_VERSION}); upgrade Lifeline", key=key)
        try:
            layout = Layout.from_dict(d["layout"])
            tensors = {}
            for fqn, t in d["tensors"].items():
                try:
                    tensors[fqn] = TensorRecord(
                        t["dtype"], tuple(int(x) for x in t["shape"]), t["pattern"],
                        tuple(ChunkRef(int(c[0]), ChunkMeta.from_list(c[1:])) for c in t["chunks"]))
                except (KeyError, TypeError, ValueError, IndexError) as err:
                    raise ManifestError(f"malformed entry of tensor {fqn!r}: {err}", key=key) from err
            entries = {int(r): {k: BytesMeta(k, int(v[0]), int(v[1]), int(v[2])) for k, v in e.items()}
                       for r, e in d["bytes"].items()}
            m = cls(job=d["job"], step=int(d["step"]), layout=layout,
                    blobs=tuple(int(n) for n in d["blobs"]), tensors=tensors, bytes_entries=entries,
                    version=version, extra=d.get("extra", {}))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ManifestError(f"malformed manifest: {err!r}", key=key) from err
        if len(m.blobs) != layout.world_size:
            raise ManifestError(f"manifest lists {len(m.blobs)} blobs for world size {layout.world_size}", key=key)
        for fqn, t in m.tensors.items():
            for ref in t.chunks:
                c = ref.chunk
                if not 0 <= ref.rank < layout.world_size or c.byte_offset + c.byte_length > m.blobs[ref.rank]:
                    raise ManifestError(f"tensor {fqn!r}: chunk {list(c.offsets)} points outside rank {ref.rank}'s blob",
                                        key=key)
        return m

    @property
    def nbytes(self) -> int:
        """Total bytes of all blobs."""
        return sum(self.blobs)
