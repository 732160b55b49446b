"""The operator's own settings, read from ``LIFELINE_OPERATOR_*`` variables (the chart sets them).

Every field ``x`` is read from ``LIFELINE_OPERATOR_<X>``; keyword arguments override the
environment (tests build settings directly).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing_extensions import Annotated

from lifeline.errors import ConfigError

__all__ = ["OperatorSettings"]


class OperatorSettings(BaseSettings):
    """What the operator needs beyond the TrainingJob: where shared services are, what to inject.

    Environment variables (prefix ``LIFELINE_OPERATOR_``):

    * ``NAMESPACES`` — comma-separated namespaces to watch; empty: every namespace (cluster-wide).
    * ``SIDECAR_IMAGE`` — image of the injected sidecar; empty: the trainer container's image
      (one image serves every role).
    * ``POD_SERVICE_ACCOUNT`` — ServiceAccount of training pods unless the template sets one.
    * ``REDIS_URL`` — the catalog (``redis://host:port/db``); handed to every pod. Required.
    * ``REDIS_PASSWORD`` — password of the Redis default user (the chart feeds it from a Secret);
      empty: no AUTH.
    * ``REDIS_JOB_USERS`` — create one Redis ACL user per job, allowed only the job's keys
      (:func:`lifeline.catalog.grant_job_user`); its password goes into the job's Secret. Off: the
      job's Secret gets ``REDIS_PASSWORD`` itself. Default false.
    * ``LIST_PODS_CLUSTER_WIDE`` — node capacity (elastic reshards) counts the pods of every
      namespace (needs the chart's opt-in ClusterRole rule); false: only the watched namespaces'
      pods (every namespace when ``NAMESPACES`` is empty). Default false.
    * ``S3_ENDPOINT`` (``host:port``), ``S3_ACCESS_KEY``, ``S3_SECRET_KEY``, ``S3_SECURE`` — object
      storage for L2; the keys are copied into each job's Secret, never into a pod spec.
    * ``RESYNC_SECONDS`` — period of the timer comparing pods/nodes/catalog with the spec. Default 3.
    * ``SIDECAR_PEER_PORT`` (7070), ``SIDECAR_METRICS_PORT`` (9400) — the sidecar's ports.
    * ``SIDECAR_RESOURCES`` — JSON ``{"requests": {...}, "limits": {...}}`` of the sidecar container.
    * ``BIND_ADDRESS`` — address of ``/metrics`` and ``/healthz`` (the chart passes the pod IP, so
      process pods of the dev cluster, which share the host's network, do not collide). Default
      ``0.0.0.0``.
    * ``METRICS_PORT`` — the operator's Prometheus ``/metrics`` port (8080; -1 disables it).
    * ``LIVENESS_PORT`` — kopf's ``/healthz`` port (8081; -1 disables it).
    * ``LOG_LEVEL`` — ``debug``, ``info``, ``warning`` or ``error``. Default ``info``.
    """

    model_config = SettingsConfigDict(env_prefix="LIFELINE_OPERATOR_", extra="ignore", populate_by_name=True)

    namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)
    sidecar_image: str = ""
    pod_service_account: str = ""
    redis_url: str = Field(min_length=1)
    redis_password: SecretStr = SecretStr("")
    redis_job_users: bool = False
    list_pods_cluster_wide: bool = False
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    s3_secure: bool = False
    resync_seconds: float = Field(default=3.0, gt=0)
    sidecar_peer_port: int = Field(default=7070, ge=1, le=65535)
    sidecar_metrics_port: int = Field(default=9400, ge=1, le=65535)
    sidecar_resources: Annotated[dict[str, Any], NoDecode] = Field(default_factory=dict)
    bind_address: str = "0.0.0.0"
    metrics_port: int = Field(default=8080, ge=-1, le=65535)
    liveness_port: int = Field(default=8081, ge=-1, le=65535)
    log_level: str = Field(default="info", pattern="^(debug|info|warning|error)$")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [n.strip() for n in v.split(",") if n.strip()]
        return v

    @field_validator("sidecar_resources", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v

    @classmethod
    def load(cls, **overrides: Any) -> OperatorSettings:
        """Read the settings from the environment (plus ``overrides``).

        Raises:
            ConfigError: naming the offending ``LIFELINE_OPERATOR_*`` variable.
        """
        from pydantic import ValidationError

        try:
            return cls(**overrides)
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "settings"
            raise ConfigError(f"LIFELINE_OPERATOR_{loc.upper()}: {first['msg']}", field=loc) from None
