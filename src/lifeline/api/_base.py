"""The pydantic base model shared by every TrainingJob model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

__all__ = ["WireModel", "FIELD_ERROR", "field_error"]

FIELD_ERROR = "lifeline_field"
"""The pydantic error type of :func:`field_error` (its context holds ``field``, the wire path)."""


def field_error(field: str, message: str) -> PydanticCustomError:
    """A validation error naming the wire path ``field`` (e.g. ``spec.replicas``), to raise in a validator.

    Unlike an exception of another type, pydantic collects it with every other problem of the object;
    :func:`lifeline.api.load_trainingjob` reports ``field`` as the path and ``message`` as the text.
    """
    return PydanticCustomError(FIELD_ERROR, "{message}", {"field": field, "message": message})


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields rejected; immutable.

    (``validate_by_name``/``serialize_by_alias`` need pydantic >= 2.11.)

    ``model_dump()`` writes the wire form (camelCase aliases) by default; use
    :meth:`to_wire` for the JSON-ready dict without unset optional fields.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )

    def to_wire(self) -> dict:
        """The wire form: camelCase keys, JSON types, ``None`` fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
