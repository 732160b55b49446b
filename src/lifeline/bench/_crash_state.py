"""Deterministic states for ``bench crash``: what a killed saver was saving, rebuilt by the reader to compare.

* :func:`library_states` — a tensor-parallel model for the checkpoint-library targets (fs, MinIO):
  a ``(rows, 1024)`` fp32 matrix sharded on dim 0, a bf16 matrix sharded on dim 1, a replicated
  fp32 norm and an int64 step counter, in a :class:`~lifeline.checkpoint.Layout` of ``tensor=2,
  data=data``; ``rows`` sets the size (``rows * 4 KiB`` of fp32 plus ~64 KiB).
* :func:`sidecar_state` — one data-parallel rank's state handed to a sidecar (identical on every
  rank, as data parallelism keeps it), so the consolidated L2 checkpoint equals it bit for bit.

Both are functions of ``seed`` only: the bench gives every save attempt its own seed, so a stale
blob of an earlier attempt mixed into a later manifest would not compare equal.
"""

from __future__ import annotations

import torch

from lifeline.checkpoint import Layout, PatternRules, Sharded, shard_state

RULES = PatternRules([("w.rows", Sharded(0)), ("w.cols", Sharded(1))])
"""Name rules of :func:`library_full` (``norm`` and ``step`` are replicated)."""


def library_full(seed: int, rows: int) -> dict[str, torch.Tensor]:
    """The full (consolidated) state for ``seed``: ``w.rows`` fp32 ``(rows, 1024)``, ``w.cols`` bf16
    ``(64, 512)``, ``norm`` fp32 ``(1024,)``, ``step`` int64 scalar. ``rows`` must be even."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w.rows": torch.randn(rows, 1024, generator=g),
        "w.cols": torch.randn(64, 512, generator=g).to(torch.bfloat16),
        "norm": torch.randn(1024, generator=g),
        "step": torch.tensor(seed, dtype=torch.int64),
    }


def library_states(seed: int, rows: int, layout: Layout) -> list[dict[str, torch.Tensor]]:
    """Every rank's local state of :func:`library_full` in ``layout`` (rank ``r`` at index ``r``)."""
    full = library_full(seed, rows)
    return [shard_state(full, layout, r, RULES) for r in range(layout.world_size)]


def sidecar_state(seed: int, numel: int) -> dict[str, torch.Tensor]:
    """A data-parallel rank's state for ``seed``: ``weight`` fp32 ``(numel,)``, ``bias`` bf16 ``(4096,)``,
    ``optimizer.step`` int64 ``(1,)``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(numel, generator=g),
        "bias": torch.randn(4096, generator=g).to(torch.bfloat16),
        "optimizer.step": torch.tensor([seed], dtype=torch.int64),
    }


def bit_identical(got: dict, want: dict) -> bool:
    """True when both maps have the same names and every tensor has the same dtype, shape and bytes."""
    if sorted(got) != sorted(want):
        return False
    for k, w in want.items():
        g = got[k]
        if g.dtype != w.dtype or g.shape != w.shape:
            return False
        if not torch.equal(g.contiguous().reshape(-1).view(torch.uint8), w.contiguous().reshape(-1).view(torch.uint8)):
            return False
    return True
