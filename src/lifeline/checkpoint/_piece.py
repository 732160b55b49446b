"""``Piece``: a box of a rank's local tensor and where it sits in the logical tensor (every pattern's answer)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Piece"]


@dataclass(frozen=True, slots=True)
class Piece:
    """A box of a local tensor and where it sits in the logical tensor.

    The local tensor, flattened, is viewed from element ``base`` as ``base_shape``
    (``base=0, base_shape=local.shape`` except for ZeRO-1 fragments); the box is
    ``offsets``/``lengths`` within that view; ``global_offsets`` is its corner in the
    logical tensor (the box has the same ``lengths`` there).
    """

    base: int
    base_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    global_offsets: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.lengths)
