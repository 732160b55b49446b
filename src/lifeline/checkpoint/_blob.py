"""Reading one rank's blob back into its local state: the inverse of :func:`write_shard`."""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from typing import Any

import torch

from lifeline.errors import LayoutError

__all__ = ["read_shard"]


def read_shard(plan: Any, stored: Any, blob: memoryview, into: MutableMapping[str, Any]) -> None:
    """Copy every entry of ``blob`` into ``into``: the inverse of ``write_shard`` (no verification:
    the caller verified ``blob`` against ``stored``'s checksums, or trusts its tier).

    Byte positions come from ``stored`` (the blob's sealed ``ShardMetadata``), never from
    ``plan``: byte entries (data-loader position, RNG states) may have another length in the
    fresh state than in the saved one, which shifts every later offset. ``plan`` (made from
    ``into``) only says where each stored chunk lands in the local tensors.

    Raises:
        LayoutError: ``into`` lacks a stored tensor or chunk, or has another shape or dtype.
    """
    buf = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)
    where = {(t.fqn, c.offsets, c.lengths): (c.byte_offset, c.byte_length) for t in stored.tensors for c in t.chunks}
    for t in plan.tensors:
        dst = into[t.fqn]
        if not dst.is_contiguous():
            raise LayoutError(f"tensor {t.fqn!r} to restore into is not contiguous", key=t.fqn)
        flat = dst.reshape(-1)
        for c in t.chunks:
            p = c.piece
            found = where.get((t.fqn, tuple(c.offsets), tuple(p.lengths)))
            if found is None or found[1] != c.byte_length:
                raise LayoutError(f"the stored shard has no chunk {tuple(c.offsets)}+{tuple(p.lengths)} of {t.fqn!r} "
                                  "(restore into a state with the saved names, shapes and dtypes)", key=t.fqn,
                                  step=stored.step, rank=stored.rank)
            src = buf[found[0] : found[0] + found[1]].view(dst.dtype).view(p.lengths)
            base = flat[p.base : p.base + math.prod(p.base_shape)].view(p.base_shape)
            base[tuple(slice(o, o + n) for o, n in zip(p.offsets, p.lengths))].copy_(src)
    for b in stored.bytes_entries:
        data = bytes(blob[b.byte_offset : b.byte_offset + b.byte_length])
        cur = into.get(b.key)
        if isinstance(cur, bytearray) and len(cur) == len(data):
            cur[:] = data
        else:
            into[b.key] = data