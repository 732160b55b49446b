"""The Lifeline exception tree.

Every error Lifeline raises derives from :class:`LifelineError` and carries the
context needed to act on it: the job, rank, step, tier and storage key involved
(any of them may be ``None`` when not applicable). The tree is deliberately
small; parts raise the most specific class that fits.

::

    LifelineError
    ├── ConfigError            bad spec, settings or CLI input (names the field)
    ├── CheckpointError        the universal format and its storage
    │   ├── ManifestError      manifest missing, unreadable or inconsistent
    │   ├── FormatVersionError manifest written by an unknown format version
    │   ├── ChecksumError      bytes do not match their recorded checksum
    │   ├── LayoutError        a layout the model or checkpoint cannot take
    │   └── StorageError       a storage backend failed (I/O, network, missing key)
    ├── SidecarError           the checkpoint sidecar and its client
    │   ├── ArenaFullError     no free shared-memory slot under the "skip" policy
    │   └── PeerError          a peer sidecar disconnected, refused or misbehaved
    │       └── AuthError      a peer failed (or we failed) HMAC authentication
    ├── CatalogError           the Redis catalog is unreachable or holds a malformed document
    ├── RecoveryError          no recovery is possible (e.g. no verified copy)
    │   └── VerificationError  a recovered state differs from the copy recorded before the failure
    └── ClusterError           the dev cluster (build, start, nodes)
        └── BuildError         building a component from source failed
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LifelineError",
    "ConfigError",
    "CheckpointError",
    "ManifestError",
    "FormatVersionError",
    "ChecksumError",
    "LayoutError",
    "StorageError",
    "SidecarError",
    "ArenaFullError",
    "PeerError",
    "AuthError",
    "CatalogError",
    "RecoveryError",
    "VerificationError",
    "ClusterError",
    "BuildError",
]

_CONTEXT_FIELDS = ("job", "rank", "step", "tier", "key")


class LifelineError(Exception):
    """Root of every error Lifeline raises.

    Args:
        message: what went wrong and, where possible, how to fix it.
        job: TrainingJob name, if known.
        rank: global rank (int), if known.
        step: training step (number of completed optimizer steps), if known.
        tier: storage tier, one of ``"L0"``, ``"L1"``, ``"L2"``, if known.
        key: storage key, tensor name or chunk identifier the error is about.
        **extra: further context (for example ``field=`` for configuration errors).

    ``str(err)`` renders the message followed by the non-empty context, e.g.
    ``checksum mismatch (job=gpt, rank=3, step=120, tier=L1, key=layers.0.w)``.
    """

    def __init__(
        self,
        message: str,
        *,
        job: str | None = None,
        rank: int | None = None,
        step: int | None = None,
        tier: str | None = None,
        key: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.job = job
        self.rank = rank
        self.step = step
        self.tier = tier
        self.key = key
        self.extra = extra

    @property
    def context(self) -> dict[str, Any]:
        """The non-``None`` context fields, in a stable order."""
        ctx = {f: getattr(self, f) for f in _CONTEXT_FIELDS if getattr(self, f) is not None}
        ctx.update({k: v for k, v in self.extra.items() if v is not None})
        return ctx

    def __str__(self) -> str:
        ctx = self.context
        if not ctx:
            return self.message
        return f"{self.message} ({', '.join(f'{k}={v}' for k, v in ctx.items())})"

    def __reduce__(self):  # keep context across pickling (multiprocessing)
        return (_rebuild, (type(self), self.message, self.context))


def _rebuild(cls: type[LifelineError], message: str, context: dict[str, Any]) -> LifelineError:
    return cls(message, **context)


class ConfigError(LifelineError):
    """Invalid spec, settings or command-line input. ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str | None = None, **context: Any) -> None:
        super().__init__(message, field=field, **context)
        self.field = field


class CheckpointError(LifelineError):
    """Base of errors about the universal checkpoint format and its storage."""


class ManifestError(CheckpointError):
    """A checkpoint's manifest is missing, unreadable, or inconsistent with its blobs."""


class FormatVersionError(CheckpointError):
    """A manifest declares a format version this Lifeline cannot read."""


class ChecksumError(CheckpointError):
    """Bytes read back do not match the checksum recorded for their chunk."""


class LayoutError(CheckpointError):
    """A layout the model or checkpoint cannot take (e.g. a degree not dividing a dimension)."""


class StorageError(CheckpointError):
    """A storage backend failed: I/O error, network error, or a key that does not exist."""


class SidecarError(LifelineError):
    """Base of errors from the checkpoint sidecar and its trainer-side client."""


class ArenaFullError(SidecarError):
    """No free shared-memory slot was available and the backpressure policy is ``skip``."""


class PeerError(SidecarError):
    """A peer sidecar disconnected mid-transfer, refused a request, or sent bad frames."""


class AuthError(PeerError):
    """HMAC authentication with a peer failed (wrong or missing job secret)."""


class CatalogError(LifelineError):
    """The Redis catalog (``lifeline.catalog``) is unreachable or holds a malformed document."""


class RecoveryError(LifelineError):
    """No recovery is possible, e.g. no tier holds a verified copy of a needed shard."""


class VerificationError(RecoveryError):
    """A recovered rank's recomputed state differs from the copy recorded for the same step before
    the failure (verified recovery, :mod:`lifeline.runtime._verify`): the recovery was not bit-identical."""


class ClusterError(LifelineError):
    """The dev cluster failed: a component would not start, a node is unknown, a port is taken."""


class BuildError(ClusterError):
    """Building a dev-cluster component from source failed."""
