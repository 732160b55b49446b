"""The documents the catalog stores besides recovery plans (those are :class:`lifeline.api.recovery.RecoveryPlan`).

Each is a frozen dataclass with ``to_json``/``from_json``; the JSON shapes are what sidecars,
trainers, the operator and ``lifeline run`` read and write, so they are defined once, here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lifeline.errors import CatalogError

__all__ = ["SidecarRegistration", "ProgressReport", "CorruptionReport", "LogCoverage", "PersistedWindows"]


def _object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise CatalogError(f"{what} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{what} is not a JSON object")
    return data


@dataclass(frozen=True)
class SidecarRegistration:
    """A sidecar's registration (``sidecar:<rank>``): where peers reach it. Refreshed every
    heartbeat period with a TTL of three periods; its presence *is* the heartbeat.

    Attributes:
        rank: the rank whose sidecar this is.
        node: the node it runs on.
        host: its pod IP (peers connect there; never a DNS name).
        port: its peer (replication/restore) TCP port.
        metrics_port: its ``/metrics`` + ``/healthz`` HTTP port.
        pid: its process id.
    """

    rank: int
    node: str
    host: str
    port: int
    metrics_port: int = 0
    pid: int = 0

    def to_json(self) -> str:
        return json.dumps({"rank": self.rank, "node": self.node, "host": self.host, "port": self.port,
                           "metrics_port": self.metrics_port, "pid": self.pid}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SidecarRegistration:
        """Raises: CatalogError: not a registration document."""
        d = _object(text, "sidecar registration")
        try:
            return cls(int(d["rank"]), str(d["node"]), str(d["host"]), int(d["port"]),
                       int(d.get("metrics_port") or 0), int(d.get("pid") or 0))
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"malformed sidecar registration: {err!r}") from None


@dataclass(frozen=True)
class ProgressReport:
    """A trainer rank's latest report (``progress`` hash; also printed as a JSON line on stdout).

    Attributes:
        event: ``init``, ``start``, ``step``, ``save``, ``restore``, ``plan``, ``failure``, ``done`` ...
        job, rank, generation: who reported, in which process-group generation.
        time: seconds since the epoch.
        step: the rank's step when it reported (``None`` when the event has none).
        fields: every other field of the event (``loss``, ``seconds``, ``error``, ``plan_generation`` ...).
    """

    event: str
    job: str
    rank: int
    generation: int
    time: float
    step: int | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str:
        """The ``error`` field of a ``failure`` report (empty otherwise)."""
        return str(self.fields.get("error", ""))

    def get(self, name: str, default: Any = None) -> Any:
        """A field of the event by name (``step``, ``generation`` ... included)."""
        if name in ("event", "job", "rank", "generation", "time", "step"):
            value = getattr(self, name)
            return default if value is None else value
        return self.fields.get(name, default)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.fields, "event": self.event, "job": self.job, "rank": self.rank,
                               "generation": self.generation, "time": self.time}
        if self.step is not None:
            out["step"] = self.step
        return out

    def to_json(self) -> str:
        """One JSON line (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProgressReport:
        """Raises: CatalogError: a required field is missing or mistyped."""
        try:
            rest = {k: v for k, v in d.items() if k not in ("event", "job", "rank", "generation", "time", "step")}
            step = d.get("step")
            return cls(str(d["event"]), str(d.get("job", "")), int(d["rank"]), int(d.get("generation", 0)),
                       float(d.get("time", 0.0)), None if step is None else int(step), rest)
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"malformed progress report: {err!r}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> ProgressReport:
        """Raises: CatalogError: not a progress report."""
        return cls.from_dict(_object(text, "progress report"))


@dataclass(frozen=True)
class CorruptionReport:
    """A copy that failed verification and was not used (``corrupt`` list), kept for the operator.

    Attributes:
        step, rank: the shard.
        tier: where the copy was (``L0``, ``L1``, ``L2``).
        where: which copy (``local@<r>``, ``peer``, ``storage``).
        by: the rank whose sidecar detected it.
        chunk: the chunk (tensor name) that failed, if known.
        error: the verification error.
        time: seconds since the epoch.
    """

    step: int | None
    rank: int | None
    tier: str
    where: str
    by: int
    chunk: str | None = None
    error: str = ""
    time: float = 0.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CorruptionReport:
        """Raises: CatalogError: not a corruption report."""
        d = _object(text, "corruption report")
        try:
            return cls(**{k: d.get(k) for k in ("step", "rank", "tier", "where", "by", "chunk")},
                       error=str(d.get("error", "")), time=float(d.get("time", 0.0)))
        except TypeError as err:
            raise CatalogError(f"malformed corruption report: {err}") from None


@dataclass(frozen=True)
class LogCoverage:
    """Upstream-log coverage of one rank (``logs`` hash, field = rank): the tensors ``rank`` sent
    across pipeline boundaries (and the gradient norms) while computing steps
    ``first_step``..``last_step`` inclusive are held by its sidecar and replicated to a peer
    (localized replay of a neighbouring stage reads them).

    ``replicas`` is how many peers hold a copy of each entry (the sidecar's ``peer_replicas``): with
    none, the loss of the rank's sidecar loses its log. ``originals_lost_to`` and ``replicas_lost_to``
    are the last steps whose originals / replicas died with a sidecar (-1: none; written by plans,
    :meth:`lifeline.catalog.Catalog.put_plan`, kept apart from this document). Equality ignores these
    three (what a plan reads is the range)."""

    rank: int
    first_step: int
    last_step: int
    replicas: int = field(default=1, compare=False)
    originals_lost_to: int = field(default=-1, compare=False)
    replicas_lost_to: int = field(default=-1, compare=False)

    def to_json(self) -> str:
        return json.dumps({"first": self.first_step, "last": self.last_step, "replicas": self.replicas},
                          sort_keys=True)

    @classmethod
    def from_json(cls, rank: int, text: str | bytes) -> LogCoverage:
        """Raises: CatalogError: not a coverage document."""
        d = _object(text, "upstream-log coverage")
        try:
            return cls(rank, int(d["first"]), int(d["last"]), int(d.get("replicas", 1)))
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"malformed upstream-log coverage: {err!r}") from None


@dataclass(frozen=True)
class PersistedWindows:
    """The sparse windows of one rank committed to L2 (``windows`` hash, field = rank): the starts of
    the windows whose W slots and manifest are in storage (``<job>/windows/rank-<r>/``), ascending.
    Written by the rank's sidecar after each window manifest and after it deletes older windows."""

    rank: int
    starts: tuple[int, ...]
    window: int

    def to_json(self) -> str:
        return json.dumps({"starts": list(self.starts), "window": self.window}, sort_keys=True)

    @classmethod
    def from_json(cls, rank: int, text: str | bytes) -> PersistedWindows:
        """Raises: CatalogError: not a persisted-windows document."""
        d = _object(text, "persisted windows")
        try:
            return cls(rank, tuple(sorted(int(s) for s in d["starts"])), int(d["window"]))
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(f"malformed persisted windows: {err!r}") from None
