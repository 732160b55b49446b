"""Pod-level settings: one pydantic-settings model per role, read from ``LIFELINE_*`` variables.

The operator (from a TrainingJob) and the local launcher fill these variables into every pod
(or process). Every field is read from the environment variable ``LIFELINE_<FIELD NAME IN
UPPER CASE>``; e.g. ``rank`` from ``LIFELINE_RANK``. Keyword arguments override the environment,
which tests use to build settings directly.

* :class:`PodSettings` — what both containers of a pod share (job, rank, arena, socket, secret).
* :class:`SidecarSettings` — the checkpoint sidecar (``python -m lifeline sidecar``).
* :class:`TrainerSettings` — the trainer's side (:class:`lifeline.sidecar.SidecarClient`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lifeline.errors import ConfigError

__all__ = ["PodSettings", "SidecarSettings", "TrainerSettings", "default_arena_dir", "ARENA_MOUNT_ENV"]


ARENA_MOUNT_ENV = "LIFELINE_MOUNT_LIFELINE_ARENA"
"""Where a dev-cluster process pod finds its arena volume (the operator's ``lifeline-arena``
emptyDir): process pods share the host's ``/dev/shm`` and see a volume at the path this variable
names, not at its ``mountPath`` (``lifeline.devcluster.node.volumes``)."""


def default_arena_dir(job: str, rank: int) -> Path:
    """A Memory-backed directory for the arena: ``/dev/shm/lifeline-<job>-<rank>`` (or the same under
    the system temp dir when there is no ``/dev/shm``).

    In a Kubernetes pod ``/dev/shm`` is the pod's arena emptyDir, which goes away with the pod.
    On the dev cluster (:data:`ARENA_MOUNT_ENV` set) it is that volume's own directory, which the
    node removes with the pod just as a kubelet removes an emptyDir (the host's ``/dev/shm``
    would keep a killed pod's slots); the directory is used as is, since a Unix socket's path
    must stay under 108 bytes.
    """
    mount = os.environ.get(ARENA_MOUNT_ENV)
    if mount:
        return Path(mount)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"lifeline-{job}-{rank}"


class PodSettings(BaseSettings):
    """Settings shared by the trainer and the sidecar of one pod (one rank).

    Environment variables (all prefixed ``LIFELINE_``):

    * ``LIFELINE_JOB`` — TrainingJob name; namespaces Redis keys and storage keys. Required.
    * ``LIFELINE_RANK`` — this pod's global rank, ``0 <= rank < world_size``. Required.
    * ``LIFELINE_WORLD_SIZE`` — number of ranks in the job. Required.
    * ``LIFELINE_NODE`` — the node this pod runs on (Kubernetes node name); replicas are placed
      on other nodes. Default: the host name.
    * ``LIFELINE_SECRET`` — the job secret; every sidecar-to-sidecar connection proves knowledge of
      it with HMAC-SHA256 (Kubernetes: from the job's Secret). Required, at least 16 characters.
    * ``LIFELINE_ARENA_DIR`` — Memory-backed directory (the pod's emptyDir with
      ``medium: Memory``) holding the shared-memory arena slots and the Unix socket.
      Default: ``/dev/shm/lifeline-<job>-<rank>``.
    * ``LIFELINE_SOCKET_PATH`` — the trainer↔sidecar Unix socket. Default ``<arena_dir>/sidecar.sock``.
    * ``LIFELINE_SLOTS`` — number of arena slots (>= 2): how many saves may be in flight or held
      in L0 at once. Default 3.
    * ``LIFELINE_SLOT_BYTES`` — size of each slot in bytes; must hold one rank's blob
      (``ShardPlan.nbytes``). Default 256 MiB.
    * ``LIFELINE_REDIS_USERNAME`` / ``LIFELINE_REDIS_PASSWORD`` — Redis AUTH of the catalog: the
      job's ACL user (allowed only the job's keys) or empty and the shared password; from the job's
      Secret. Both empty: no AUTH.
    * ``LIFELINE_PREEMPT_GRACE_SECONDS`` — seconds between the SIGTERM of a deleted pod and its SIGKILL
      (the operator sets the pod's ``terminationGracePeriodSeconds``). > 0: the trainer checkpoints the
      step it completes to L1 before it leaves (:mod:`lifeline.runtime._preempt`) and the sidecar keeps
      serving meanwhile (:mod:`lifeline.sidecar._drain`). Default 0: SIGTERM stops either at once.
    """

    model_config = SettingsConfigDict(env_prefix="LIFELINE_", extra="ignore", populate_by_name=True)

    job: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    node: str = Field(default_factory=lambda: os.uname().nodename, min_length=1)
    secret: SecretStr
    arena_dir: Path | None = None
    socket_path: Path | None = None
    slots: int = Field(default=3, ge=2)
    slot_bytes: int = Field(default=256 << 20, ge=4096)
    redis_username: str = ""
    redis_password: SecretStr = SecretStr("")
    preempt_grace_seconds: float = Field(default=0.0, ge=0)

    @field_validator("secret")
    @classmethod
    def _secret_long_enough(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value()) < 16:
            raise ValueError("LIFELINE_SECRET must be at least 16 characters (use the job's generated Secret)")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> PodSettings:
        if self.rank >= self.world_size:
            raise ValueError(f"LIFELINE_RANK={self.rank} must be < LIFELINE_WORLD_SIZE={self.world_size}")
        if self.arena_dir is None:
            self.arena_dir = default_arena_dir(self.job, self.rank)
        if self.socket_path is None:
            self.socket_path = Path(self.arena_dir) / "sidecar.sock"
        return self

    @classmethod
    def load(cls, **overrides):
        """Read the settings from the environment (plus ``overrides``).

        Raises:
            ConfigError: naming the first offending variable (``field``) and what it must be.
        """
        from pydantic import ValidationError

        try:
            return cls(**overrides)
        except ValidationError as err:
            first = err.errors()[0]
            msg = str(first["msg"]).removeprefix("Value error, ")
            if first["loc"]:
                loc = ".".join(str(p) for p in first["loc"])
                var = f"LIFELINE_{loc.upper()}"
                raise ConfigError(f"{var}: {msg}", field=loc) from None
            named = re.search(r"LIFELINE_([A-Z0-9_]+)", msg)
            raise ConfigError(msg, field=named.group(1).lower() if named else None) from None


class SidecarSettings(PodSettings):
    """Settings of the checkpoint sidecar (the software DPU), in addition to :class:`PodSettings`.

    Environment variables (all prefixed ``LIFELINE_``):

    * ``LIFELINE_POD_IP`` — this pod's IP; the peer (replication/restore) server binds it and
      registers it in the catalog. Default ``127.0.0.1``.
    * ``LIFELINE_PEER_PORT`` — TCP port of the peer server. Default 7070; 0 picks a free port
      (registered in the catalog, so peers still find it).
    * ``LIFELINE_METRICS_PORT`` — HTTP port of ``/metrics`` (Prometheus) and ``/healthz``, bound on
      ``pod_ip``. Default 9400; 0 picks a free port; -1 disables the endpoint.
    * ``LIFELINE_REDIS_URL`` — the catalog, e.g. ``redis://lifeline-redis:6379/0``. Required.
    * ``LIFELINE_PERSIST_URI`` — where L2 checkpoints go: ``s3://bucket/prefix``, ``file:///path``
      or a plain path. Empty disables L2.
    * ``LIFELINE_S3_ENDPOINT`` — ``host:port`` of the S3/MinIO endpoint (for ``s3://`` URIs).
    * ``LIFELINE_S3_ACCESS_KEY`` / ``LIFELINE_S3_SECRET_KEY`` — S3 credentials.
    * ``LIFELINE_S3_SECURE`` — use HTTPS. Default false.
    * ``LIFELINE_PERSIST_EVERY`` — persist every P-th complete checkpoint (steps divisible by P).
      Default 50; 0 disables L2.
    * ``LIFELINE_KEEP`` — K: latest checkpoints of this rank kept in L0 memory. Default 2.
    * ``LIFELINE_PEER_REPLICAS`` — L1 copies of each shard on peer sidecars on other nodes
      (placement per Gemini, SOSP'23 §4). Default 1; 0 disables L1.
    * ``LIFELINE_REQUIRED_TIER`` — the tier every shard of a step must be verified at before the
      step is *complete*: ``L0``, ``L1`` or ``L2``. Default ``L1`` when ``peer_replicas > 0``
      else ``L0``.
    * ``LIFELINE_MEMORY_BYTES`` — bound on bytes held in memory (arena slots in use plus replicas
      and upstream logs held for peers). Over it, the oldest checkpoint that is not the latest
      complete one is evicted. Default: 4 × slots × slot_bytes.
    * ``LIFELINE_HEARTBEAT_SECONDS`` — catalog heartbeat period. Default 2.0; the registration
      expires after 3 periods.
    * ``LIFELINE_CHUNK_BYTES`` — size of one streamed replication frame. Default 4 MiB.
    * ``LIFELINE_PERSIST_RETRIES`` — attempts per object before a persistence round is retried
      later. Default 5.
    """

    pod_ip: str = "127.0.0.1"
    peer_port: int = Field(default=7070, ge=0, le=65535)
    metrics_port: int = Field(default=9400, ge=-1, le=65535)
    redis_url: str = Field(min_length=1)
    persist_uri: str = ""
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    s3_secure: bool = False
    persist_every: int = Field(default=50, ge=0)
    keep: int = Field(default=2, ge=1)
    peer_replicas: int = Field(default=1, ge=0)
    required_tier: Literal["L0", "L1", "L2"] | None = None
    memory_bytes: int | None = Field(default=None, ge=4096)
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    chunk_bytes: int = Field(default=4 << 20, ge=4096)
    persist_retries: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _sidecar_defaults(self) -> SidecarSettings:
        if self.required_tier is None:
            self.required_tier = "L1" if self.peer_replicas > 0 else "L0"
        if self.required_tier == "L1" and self.peer_replicas == 0:
            raise ValueError("LIFELINE_REQUIRED_TIER=L1 needs LIFELINE_PEER_REPLICAS >= 1")
        if self.required_tier == "L2" and not self.persist_enabled:
            raise ValueError("LIFELINE_REQUIRED_TIER=L2 needs LIFELINE_PERSIST_URI and LIFELINE_PERSIST_EVERY > 0")
        if self.memory_bytes is None:
            self.memory_bytes = 4 * self.slots * self.slot_bytes
        if self.peer_replicas >= self.world_size and self.world_size > 1:
            raise ValueError(
                f"LIFELINE_PEER_REPLICAS={self.peer_replicas} must be < LIFELINE_WORLD_SIZE={self.world_size}"
            )
        return self

    @property
    def persist_enabled(self) -> bool:
        """True when L2 persistence is configured (a URI and ``persist_every > 0``)."""
        return bool(self.persist_uri) and self.persist_every > 0


class TrainerSettings(PodSettings):
    """Settings of the trainer's side of the sidecar protocol, in addition to :class:`PodSettings`.

    Environment variables (all prefixed ``LIFELINE_``):

    * ``LIFELINE_BACKPRESSURE`` — what a save does when no arena slot is free: ``wait`` (block until
      one frees, measured and reported in :class:`~lifeline.sidecar.SaveReceipt`) or ``skip``
      (skip this save, reported). Default ``wait``.
    * ``LIFELINE_WAIT_TIMEOUT_SECONDS`` — the longest a ``wait`` may block before the save raises
      :class:`~lifeline.errors.ArenaFullError`. Default 600.
    * ``LIFELINE_CONNECT_TIMEOUT_SECONDS`` — how long the client waits for the sidecar's socket to
      appear. Default 60.

    Runtime (``lifeline.runtime.init`` / ``python -m lifeline trainer``; added by the runtime part,
    all optional):

    * ``LIFELINE_POD_IP`` — this pod's IP; generation rank 0 serves the rendezvous store on it.
      Default ``127.0.0.1``.
    * ``LIFELINE_REDIS_URL`` — the catalog (rendezvous addresses, recovery plans, progress).
      Empty: single-rank runs only.
    * ``LIFELINE_LAYOUT`` — JSON ``{"tensor": T, "pipeline": P, "data": D, "expert": E}``; the
      product must equal the world size. Default: pure data parallel over the world size.
    * ``LIFELINE_GENERATION`` — the process-group generation to join. Default: the catalog's.
    * ``LIFELINE_STEPS`` — train until this many optimizer steps are complete. Default 100.
    * ``LIFELINE_CHECKPOINT_EVERY`` — steps between checkpoints. Default 1.
    * ``LIFELINE_OVERLAP_SAVE`` — the memcpy of a save into the arena overlaps the next step's
      forward and backward passes and is joined before its optimizer update (CheckFreq's pipelined
      snapshot); ``false`` copies before the next step starts. Default ``true``.
    * ``LIFELINE_UPSTREAM_LOG_STEPS`` — upstream logging for localized replay: keep the tensors this
      rank sends across pipeline boundaries for this many steps (two windows). Default 0: off.
    * ``LIFELINE_SPARSE_WINDOW`` — sparse expert checkpoints (MoEvement): W, the steps of a window;
      each step's slot goes to the sidecar's log store with the upstream log. Default 0: off.
    * ``LIFELINE_CHECKPOINT_URI`` — checkpoint to storage directly (``file:///path``, a path or
      ``s3://bucket/prefix``) instead of through the sidecar. Default empty (the sidecar).
    * ``LIFELINE_MODEL`` — JSON overrides of the reference model's config fields. Default ``{}``.
    * ``LIFELINE_NUMERICS`` — JSON of ``spec.recovery.lossSpike`` (``enabled``, ``factor``, ``window``,
      ``skipSteps``): the NaN and loss-spike check of every step (docs/numerics.md). Default empty: the
      check on with its defaults.
    * ``LIFELINE_PERSIST_URI``, ``LIFELINE_S3_ENDPOINT``, ``LIFELINE_S3_ACCESS_KEY``,
      ``LIFELINE_S3_SECRET_KEY``, ``LIFELINE_S3_SECURE`` — the L2 store (as the sidecar's): a restore
      into another layout (elastic reshard) reads the universal checkpoint from it.
    * ``LIFELINE_PEER_REPLICAS`` — the sidecars' L1 copies of each shard (as the sidecar's): 0 tells a
      preempted trainer not to wait for an L1 copy that will never come. Default 1.
    * ``LIFELINE_PERSIST_EVERY`` — the sidecars' L2 interval (steps). When it divides
      ``LIFELINE_STEPS``, a rank that trained the last step stays (reporting ``awaiting_l2``) until
      that checkpoint is committed to L2, up to ``LIFELINE_RECOVERY_TIMEOUT_SECONDS``: a job is not
      Succeeded before its final checkpoint is durable. Default 0: it does not wait.
    * ``LIFELINE_RENDEZVOUS_TIMEOUT_SECONDS`` (300), ``LIFELINE_COLLECTIVE_TIMEOUT_SECONDS`` (60),
      ``LIFELINE_RECOVERY_TIMEOUT_SECONDS`` (600) — deadlines of the rendezvous, of one collective,
      and of waiting for a recovery plan after a failure.
    """

    backpressure: Literal["wait", "skip"] = "wait"
    wait_timeout_seconds: float = Field(default=600.0, gt=0)
    connect_timeout_seconds: float = Field(default=60.0, gt=0)
    # runtime (lifeline.runtime), all optional
    pod_ip: str = "127.0.0.1"
    redis_url: str = ""
    layout: dict[str, int] | None = None
    generation: int | None = Field(default=None, ge=0)
    steps: int = Field(default=100, ge=0)
    checkpoint_every: int = Field(default=1, ge=1)
    overlap_save: bool = True
    upstream_log_steps: int = Field(default=0, ge=0)
    sparse_window: int = Field(default=0, ge=0)
    checkpoint_uri: str = ""
    model: dict[str, Any] = Field(default_factory=dict)
    numerics: str = ""
    rendezvous_timeout_seconds: float = Field(default=300.0, gt=0)
    collective_timeout_seconds: float = Field(default=60.0, gt=0)
    recovery_timeout_seconds: float = Field(default=600.0, gt=0)
    persist_uri: str = ""
    persist_every: int = Field(default=0, ge=0)
    peer_replicas: int = Field(default=1, ge=0)
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    s3_secure: bool = False
