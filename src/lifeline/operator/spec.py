"""Parse and validate a TrainingJob body (via :mod:`lifeline.api`) for the handlers.

An invalid spec is a permanent condition: retrying cannot fix it. :func:`parse_job` turns the
api's :class:`~lifeline.errors.ConfigError` into a :class:`InvalidSpec` carrying the Failed
status to write, and the handler raises ``kopf.PermanentError`` after writing it, so the job
is marked Failed with a reason once and never retried forever. :func:`invalid_spec` builds the
same error for what only shows later: a pod template the pod manifest cannot be built from, or a
pod the API server refuses (400/422) at creation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from lifeline.api.load import load_trainingjob
from lifeline.api.manifests import rank_pod
from lifeline.api.trainingjob import TrainingJob
from lifeline.errors import ConfigError
from lifeline.operator.status import next_status

__all__ = ["InvalidSpec", "parse_job", "invalid_spec", "build_pod", "pod_refused", "refuses_the_pod", "REASON_INVALID_SPEC", "MAX_MESSAGE"]

REASON_INVALID_SPEC = "InvalidSpec"

MAX_MESSAGE = 2000
"""Characters of the Failed message kept (a hostile spec can make an error message huge)."""


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
    try:
        job = load_trainingjob(data)
    except ConfigError as err:
        field = getattr(err, "field", None)
        raise invalid_spec(body, err.message + (f" (field {field})" if field else ""), field=field) from err
    return job


def invalid_spec(body: Mapping[str, Any], message: str, *, field: str | None = None) -> InvalidSpec:
    """The :class:`InvalidSpec` of a TrainingJob whose spec cannot be run.

    Args:
        body: the whole object as read from the API server (its ``status`` is kept: progress
            fields stay, the phase becomes Failed).
        message: what is wrong, naming the field and the fix; cut to :data:`MAX_MESSAGE` characters.
        field: the offending field's path (``spec.template.spec.containers[0].env``), if known.

    Returns:
        The error to raise (not raised here); ``.status`` is the Failed status to write.
    """
    meta = body.get("metadata") or {}
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    failed = next_status(
        body.get("status") or {},
        phase="Failed",
        reason=REASON_INVALID_SPEC,
        message=message,
        observed_generation=meta.get("generation"),
    )
    return InvalidSpec(message, status=failed, field=field, job=meta.get("name"))


_TEMPLATE = "spec.template"


def build_pod(body: Mapping[str, Any], job: TrainingJob, rank: int, **kwargs: Any) -> dict[str, Any]:
    """:func:`lifeline.api.manifests.rank_pod` (same keyword arguments), with a template no pod can
    be built from (a map where a list belongs, a string where an object belongs) turned into an
    invalid spec. The CRD schema types the fields the operator merges into; this is the net
    under it for a template written around the schema (e.g. with validation off).

    Raises:
        InvalidSpec: naming ``spec.template``, the Python error and the expected shapes.
    """
    try:
        return rank_pod(job, rank, **kwargs)
    except (TypeError, AttributeError, KeyError, ValueError) as err:
        raise invalid_spec(body, f"{_TEMPLATE} cannot be made into a pod ({type(err).__name__}: {err}); write it as "
                           "a Kubernetes PodTemplateSpec: containers[].env a list of {name, value}, volumes and "
                           "volumeMounts lists of objects, labels and annotations maps of strings",
                           field=_TEMPLATE) from err


# A 403 on pod creation that is not about the pod itself: the operator's rights, a quota that may
# free up, a namespace going away. These are retried; any other 403 is an admission plugin refusing
# this pod (priority set by hand, a PodSecurity violation): the same pod is refused every time.
_RETRIED_403 = ("cannot create resource", "exceeded quota", "being terminated")


def refuses_the_pod(err: ApiException) -> bool:
    """True when the API server's answer to a pod creation refuses that pod as invalid: 400 (not
    decodable), 422 (validation) or a 403 from an admission plugin (not RBAC, a quota or a
    terminating namespace, which may clear and are retried)."""
    if err.status in (400, 422):
        return True
    return err.status == 403 and not any(text in str(err.body or "") for text in _RETRIED_403)


def pod_refused(body: Mapping[str, Any], pod: str, err: ApiException | ValidationError) -> InvalidSpec:
    """The :class:`InvalidSpec` of a pod refused as invalid: by the API server (HTTP 400 or 422),
    by an admission plugin (HTTP 403, see :func:`refuses_the_pod`),
    or by the Kubernetes client before sending it (its pydantic ``ValidationError``, e.g. a map where
    the pod's ``containerPort`` integer belongs). The same template is refused on every retry, so
    the job fails once with the refusal's reason.

    Args:
        body: the TrainingJob object.
        pod: the refused pod's name.
        err: the refusal; the API server's Status ``message`` (which names the pod field), or each
            of the client's errors as ``<pod field>: <problem>``, is quoted.
    """
    if isinstance(err, ValidationError):
        reason = "; ".join(".".join(str(p) for p in e["loc"][1:]) + ": " + e["msg"] for e in err.errors()[:5])
    else:
        try:
            answer = json.loads(err.body or "")
            reason = answer.get("message") if isinstance(answer, dict) else None
        except (TypeError, ValueError):
            reason = None
        reason = str(reason or err.body or err.reason)
    return invalid_spec(body, f"pod {pod} made from {_TEMPLATE} is invalid: {reason}; fix the pod template",
                        field=_TEMPLATE)
