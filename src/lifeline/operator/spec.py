"""Parse and validate a TrainingJob body (via :mod:`lifeline.api`) for the handlers.

An invalid spec is a permanent condition: retrying cannot fix it. :func:`parse_job` turns the
api's :class:`~lifeline.errors.ConfigError` into a :class:`InvalidSpec` carrying the Failed
status to write, and the handler raises ``kopf.PermanentError`` after writing it, so the job
is marked Failed with a reason once and never retried forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lifeline.api.load import load_trainingjob
from lifeline.api.trainingjob import TrainingJob
from lifeline.errors import ConfigError
from lifeline.operator.status import next_status

__all__ = ["InvalidSpec", "parse_job", "REASON_INVALID_SPEC"]

REASON_INVALID_SPEC = "InvalidSpec"


class InvalidSpec(ConfigError):
    """A TrainingJob whose spec cannot be run; ``status`` is the Failed status to write.

    Attributes:
        status: the new ``.status`` (wire form): phase Failed, every condition's reason
            ``InvalidSpec``, the message naming the field and the fix.
    """

    def __init__(self, message: str, *, status: dict[str, Any], field: str | None = None, job: str | None = None):
        super().__init__(message, field=field, job=job)
        self.status = status


def parse_job(body: Mapping[str, Any]) -> TrainingJob:
    """Validate a TrainingJob body as delivered by kopf (or read from the API server).

    Args:
        body: the whole object (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``).

    Returns:
        The validated :class:`~lifeline.api.TrainingJob` (defaults filled in).

    Raises:
        InvalidSpec: the spec is invalid; carries the Failed status naming the field and fix.
    """
    data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    data["metadata"] = dict(body.get("metadata") or {})
    status = body.get("status") or {}
    try:
        job = load_trainingjob(data)
    except ConfigError as err:
        meta = data["metadata"]
        message = f"{err.message}" + (f" (field {err.field})" if getattr(err, "field", None) else "")
        failed = next_status(
            status,
            phase="Failed",
            reason=REASON_INVALID_SPEC,
            message=message,
            observed_generation=meta.get("generation"),
        )
        raise InvalidSpec(message, status=failed, field=getattr(err, "field", None), job=meta.get("name")) from err
    return job

