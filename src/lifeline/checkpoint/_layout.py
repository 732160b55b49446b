"""The parallel layout (tensor, pipeline, data and expert degrees) and rank coordinates."""

from __future__ import annotations

from dataclasses import dataclass

from lifeline.errors import LayoutError

__all__ = ["Layout", "RankCoords"]


@dataclass(frozen=True, slots=True)
class RankCoords:
    """A rank's coordinates in a :class:`Layout` (each in ``[0, degree)``)."""

    tensor: int = 0
    pipeline: int = 0
    data: int = 0
    expert: int = 0


@dataclass(frozen=True, slots=True)
class Layout:
    """Tensor, pipeline, data and expert parallel degrees.

    Rank order is Megatron-style: tensor fastest, then expert, then data, then pipeline
    slowest: ``rank = ((pipeline * D + data) * E + expert) * T + tensor``. The expert degree
    subdivides the data-parallel replicas of the MoE layers here as an independent axis, so
    ``world_size = T * P * D * E``.
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    expert: int = 1

    def validate(self) -> Layout:
        """Check every degree is a positive int; returns ``self``. Raises :class:`LayoutError`."""
        for name in ("tensor", "pipeline", "data", "expert"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"layout degree {name}={value!r} must be an int >= 1", key=name)
        return self

    @property
    def world_size(self) -> int:
        """Number of ranks: ``tensor * pipeline * data * expert``."""
        return self.tensor * self.pipeline * self.data * self.expert

    def coords(self, rank: int) -> RankCoords:
        """The coordinates of global ``rank``. Raises :class:`LayoutError` when out of range."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world size {self.world_size} of {self}", rank=rank)
        tensor = rank % self.tensor
        rest = rank // self.tensor
        expert = rest % self.expert
        rest //= self.expert
        data = rest % self.data
        pipeline = rest // self.data
        return RankCoords(tensor=tensor, pipeline=pipeline, data=data, expert=expert)

    def rank(self, coords: RankCoords) -> int:
        """The global rank at ``coords`` (inverse of :meth:`coords`)."""
        for name in ("tensor", "pipeline", "data", "expert"):
            if not 0 <= getattr(coords, name) < getattr(self, name):
                raise LayoutError(f"coordinate {name}={getattr(coords, name)} outside {self}", key=name)
        return ((coords.pipeline * self.data + coords.data) * self.expert + coords.expert) * self.tensor + coords.tensor

    def to_dict(self) -> dict[str, int]:
        """``{"tensor": T, "pipeline": P, "data": D, "expert": E}``."""
        return {"tensor": self.tensor, "pipeline": self.pipeline, "data": self.data, "expert": self.expert}

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """Inverse of :meth:`to_dict`; validates."""
        try:
            return cls(**{k: int(d[k]) for k in ("tensor", "pipeline", "data", "expert")}).validate()
        except (KeyError, TypeError, ValueError) as err:
            raise LayoutError(f"bad layout {d!r}: {err}") from err
