"""Pure builders of the objects the operator creates: one Pod per rank and one Secret per job.

No I/O here: every function takes the validated :class:`~lifeline.api.TrainingJob` and plain
values and returns a dict in the Kubernetes wire shape, so tests compare them directly.

A rank's pod (``<job>-<rank>``) holds the user's ``trainer`` container (from
``spec.template``) and an injected ``sidecar`` container (``python -m lifeline sidecar``,
same image unless the operator is told otherwise). Both mount one Memory-backed emptyDir at
``/dev/shm``: the settings' default arena directory ``/dev/shm/lifeline-<job>-<rank>`` (arena
slots and the Unix socket) lies in it, so ``LIFELINE_ARENA_DIR`` is not set and the same pod
works on the dev cluster, whose process pods see volumes at a per-pod path rather than at
``mountPath`` (docs/operator.md). Both containers read their :mod:`lifeline.api.pod` settings from
``LIFELINE_*`` variables: the pod IP and node through the downward API, the job's HMAC key
and S3 credentials through ``secretKeyRef`` to the job's Secret (never literal values).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lifeline.api._retention import sparse_window, upstream_log_steps
from lifeline.api._security import (
    TMP_MOUNT,
    TMP_VOLUME,
    restricted_container_context,
    restricted_pod_context,
    with_defaults,
)
from lifeline.api.pod import PodSettings, SidecarSettings, TrainerSettings
from lifeline.api.trainingjob import API_VERSION, KIND, TRAINER_CONTAINER, LayoutSpec, TrainingJob

__all__ = [
    "LABEL_JOB", "LABEL_RANK", "LABEL_GENERATION", "LABEL_MANAGED_BY", "MANAGED_BY", "SIDECAR_CONTAINER",
    "ARENA_VOLUME", "ARENA_MOUNT", "SECRET_HMAC_KEY", "SECRET_S3_ACCESS_KEY", "SECRET_S3_SECRET_KEY",
    "SECRET_REDIS_USERNAME", "SECRET_REDIS_PASSWORD", "TERMINATION_GRACE_SECONDS", "PodConfig", "pod_name",
    "secret_name", "job_selector", "owner_reference", "job_secret", "rank_pod",
]

LABEL_JOB = "lifeline.dev/job"
LABEL_RANK = "lifeline.dev/rank"
LABEL_GENERATION = "lifeline.dev/generation"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "lifeline-operator"
SIDECAR_CONTAINER = "sidecar"
ARENA_VOLUME = "lifeline-arena"
ARENA_MOUNT = "/dev/shm"
SECRET_HMAC_KEY = "hmac-key"
SECRET_S3_ACCESS_KEY = "s3-access-key"
SECRET_S3_SECRET_KEY = "s3-secret-key"
SECRET_REDIS_USERNAME = "redis-username"
SECRET_REDIS_PASSWORD = "redis-password"
_HOSTNAME = "kubernetes.io/hostname"
TERMINATION_GRACE_SECONDS = 60
"""A pod's ``terminationGracePeriodSeconds`` unless the template sets one (Kubernetes' default is 30): a
preempted or drained trainer finishes its step, saves it and waits for its L1 copy within it (docs/preemption.md)."""


@dataclass(frozen=True)
class PodConfig:
    """Runner-wide inputs of every pod (the operator's settings, or ``lifeline run``'s services).

    Attributes:
        redis_url: the catalog URL handed to both containers.
        sidecar_image: image of the sidecar; empty: the trainer container's image.
        service_account: ServiceAccount of the pod unless the template sets one; empty: none set.
        s3_endpoint: ``host:port`` of object storage for ``s3://`` persist URIs; empty: none.
        s3_secure: use HTTPS to reach ``s3_endpoint``.
        peer_port: the sidecar's peer (replication/restore) TCP port.
        metrics_port: the sidecar's ``/metrics`` + ``/healthz`` HTTP port (the readiness probe).
        sidecar_resources: ``{"requests": ..., "limits": ...}`` of the sidecar container.
        preemption: set ``LIFELINE_PREEMPT_GRACE_SECONDS`` (both containers) to the pod's grace; ``lifeline
            run`` sets it only with a ``preempt`` injection (:mod:`lifeline.launch._preempt`).
    """

    redis_url: str
    sidecar_image: str = ""
    service_account: str = ""
    s3_endpoint: str = ""
    s3_secure: bool = False
    peer_port: int = 7070
    metrics_port: int = 9400
    sidecar_resources: Mapping[str, Any] = field(default_factory=dict)
    preemption: bool = True


def pod_name(job: str, rank: int) -> str:
    """The pod of ``rank``: ``<job>-<rank>``."""
    return f"{job}-{rank}"


def secret_name(job: str) -> str:
    """The job's Secret (HMAC key, S3 credentials): ``<job>-lifeline``."""
    return f"{job}-lifeline"


def job_selector(job: str) -> str:
    """Label selector of every pod of ``job`` (for list/watch calls)."""
    return f"{LABEL_JOB}={job}"


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    """The controller ownerReference to ``job`` (garbage collection deletes what it owns).

    Raises:
        KeyError: ``metadata.uid`` is missing (the job was not read from the API server).
    """
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata["name"],
        "uid": job.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_secret(job: TrainingJob, *, hmac_key: str, s3_access_key: str = "", s3_secret_key: str = "",
               redis_username: str = "", redis_password: str = "") -> dict[str, Any]:
    """The job's Secret: the HMAC key every sidecar-to-sidecar transfer is authenticated with.

    Args:
        job: the TrainingJob (with ``metadata.name``, ``namespace`` and ``uid``).
        hmac_key: at least 16 characters, e.g. ``secrets.token_hex(32)`` (64 hex characters).
        s3_access_key / s3_secret_key: object-storage credentials copied for the sidecars.
        redis_username / redis_password: the catalog's AUTH for both containers: the job's Redis
            ACL user (:func:`lifeline.catalog.job_user`), or ``""`` and the shared password.

    Raises:
        ValueError: ``hmac_key`` is shorter than 16 characters (the sidecar refuses it).
    """
    if len(hmac_key) < 16:
        raise ValueError("hmac_key must be at least 16 characters (use secrets.token_hex(32))")
    name = job.metadata["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(name),
            "namespace": job.metadata.get("namespace"),
            "labels": {LABEL_JOB: name, LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job)],
        },
        "stringData": {
            SECRET_HMAC_KEY: hmac_key,
            SECRET_S3_ACCESS_KEY: s3_access_key,
            SECRET_S3_SECRET_KEY: s3_secret_key,
            SECRET_REDIS_USERNAME: redis_username,
            SECRET_REDIS_PASSWORD: redis_password,
        },
    }


def _env(name: str, settings: type, value: str | None = None, **source: Any) -> dict[str, Any]:
    field_name = name.removeprefix("LIFELINE_").lower()
    if field_name not in settings.model_fields:  # a typo here would be silently ignored by the pod
        raise AssertionError(f"{name} is not a field of {settings.__name__}")
    return {"name": name, "value": value} if value is not None else {"name": name, "valueFrom": source}


def _common_env(job: TrainingJob, rank: int, world_size: int, config: PodConfig) -> list[dict]:
    name = job.metadata["name"]
    secret = secret_name(name)
    return [
        _env("LIFELINE_JOB", PodSettings, name),
        _env("LIFELINE_RANK", PodSettings, str(rank)),
        _env("LIFELINE_WORLD_SIZE", PodSettings, str(world_size)),
        _env("LIFELINE_NODE", PodSettings, fieldRef={"fieldPath": "spec.nodeName"}),
        _env("LIFELINE_SECRET", PodSettings, secretKeyRef={"name": secret, "key": SECRET_HMAC_KEY}),
        _env("LIFELINE_REDIS_URL", SidecarSettings, config.redis_url),
        # optional: a Secret written before Redis AUTH existed lacks these keys (then: no AUTH)
        _env("LIFELINE_REDIS_USERNAME", PodSettings, secretKeyRef={"name": secret, "key": SECRET_REDIS_USERNAME,
                                                                   "optional": True}),
        _env("LIFELINE_REDIS_PASSWORD", PodSettings, secretKeyRef={"name": secret, "key": SECRET_REDIS_PASSWORD,
                                                                   "optional": True}),
        _env("LIFELINE_POD_IP", SidecarSettings, fieldRef={"fieldPath": "status.podIP"}),
    ]


def _sidecar_env(job: TrainingJob, config: PodConfig) -> list[dict]:
    ck = job.spec.checkpoint
    env = [
        _env("LIFELINE_PEER_PORT", SidecarSettings, str(config.peer_port)),
        _env("LIFELINE_METRICS_PORT", SidecarSettings, str(config.metrics_port)),
        _env("LIFELINE_KEEP", SidecarSettings, str(ck.keep)),
        _env("LIFELINE_PEER_REPLICAS", SidecarSettings, str(ck.peer_replicas)),
        _env("LIFELINE_PERSIST_URI", SidecarSettings, ck.persist.uri if ck.persist else ""),
        _env("LIFELINE_PERSIST_EVERY", SidecarSettings, str(ck.persist.every if ck.persist else 0)),
        _env("LIFELINE_HEARTBEAT_SECONDS", SidecarSettings, f"{job.spec.recovery.heartbeat_seconds:g}"),
    ]
    if ck.memory_limit is not None:
        env.append(_env("LIFELINE_MEMORY_BYTES", SidecarSettings, str(ck.memory_limit)))
    return env + _s3_env(job, config, SidecarSettings)


def _s3_env(job: TrainingJob, config: PodConfig, settings: type) -> list[dict]:
    """Object-storage access for ``s3://``, ``az://`` and ``gs://`` persist URIs (the sidecar persists
    there; the trainer reads it when restoring into another layout); empty for other URIs. The
    variables keep their S3 names for all three: for ``az://`` the endpoint is the account URL and the
    keys are the account name and key; for ``gs://`` the endpoint is an emulator's base URL (empty:
    Google's), the access key the project and the secret key a service-account key file's path (empty:
    the pod's application default credentials) (:func:`lifeline.checkpoint.storage_from_uri` reads
    them by scheme)."""
    ck = job.spec.checkpoint
    if ck.persist is None or not ck.persist.uri.startswith(("s3://", "az://", "gs://")):
        return []
    secret = secret_name(job.metadata["name"])
    return [
        _env("LIFELINE_S3_ENDPOINT", settings, config.s3_endpoint),
        _env("LIFELINE_S3_SECURE", settings, "true" if config.s3_secure else "false"),
        _env("LIFELINE_S3_ACCESS_KEY", settings, secretKeyRef={"name": secret, "key": SECRET_S3_ACCESS_KEY}),
        _env("LIFELINE_S3_SECRET_KEY", settings, secretKeyRef={"name": secret, "key": SECRET_S3_SECRET_KEY}),
    ]


def _trainer_env(job: TrainingJob, layout: LayoutSpec, config: PodConfig) -> list[dict]:
    """The runtime's settings. ``LIFELINE_GENERATION`` is left unset on purpose: the runtime then
    joins the catalog's current generation, which stays right when the kubelet restarts a crashed
    trainer in place after the operator has published a newer plan. The L2 store's URI and
    credentials let a trainer restore into another layout (an elastic reshard) from L2."""
    spec = job.spec
    model = {"seed": spec.seed, **(spec.model.args if spec.model else {})}
    persist = spec.checkpoint.persist
    return [
        _env("LIFELINE_LAYOUT", TrainerSettings, json.dumps(layout.to_wire(), sort_keys=True)),
        _env("LIFELINE_STEPS", TrainerSettings, str(spec.steps)),
        _env("LIFELINE_CHECKPOINT_EVERY", TrainerSettings, str(spec.checkpoint.every)),
        _env("LIFELINE_UPSTREAM_LOG_STEPS", TrainerSettings, str(upstream_log_steps(spec))),
        _env("LIFELINE_SPARSE_WINDOW", TrainerSettings, str(sparse_window(spec))),
        _env("LIFELINE_MODEL", TrainerSettings, json.dumps(model, sort_keys=True)),
        _env("LIFELINE_NUMERICS", TrainerSettings, json.dumps(spec.recovery.loss_spike.to_wire(), sort_keys=True)),
        _env("LIFELINE_BACKPRESSURE", TrainerSettings, spec.checkpoint.backpressure),
        _env("LIFELINE_PERSIST_URI", TrainerSettings, persist.uri if persist else ""),
        _env("LIFELINE_PERSIST_EVERY", TrainerSettings, str(persist.every if persist else 0)),
        _env("LIFELINE_PEER_REPLICAS", TrainerSettings, str(spec.checkpoint.peer_replicas)),
    ] + _s3_env(job, config, TrainerSettings)


def _merge_env(base: list[dict], ours: list[dict]) -> list[dict]:
    """``ours`` wins over same-named user variables; user variables keep their order first."""
    names = {e["name"] for e in ours}
    return [e for e in base if e.get("name") not in names] + ours


def _shared_user_env(trainer: Mapping[str, Any]) -> list[dict]:
    """Arena sizing set by the user on the trainer must reach the sidecar too (both map the slots)."""
    return [e for e in trainer.get("env", []) if e.get("name") in ("LIFELINE_SLOTS", "LIFELINE_SLOT_BYTES")]


def _avoid_nodes(affinity: Mapping[str, Any] | None, nodes: Iterable[str]) -> dict[str, Any] | None:
    """Add ``kubernetes.io/hostname NotIn nodes`` to every required node-selector term.

    Terms are ORed by Kubernetes, so the expression goes into each existing term (AND within
    a term); with no term, one is created.
    """
    avoid = sorted(set(nodes))
    if not avoid:
        return copy.deepcopy(dict(affinity)) if affinity else None
    out = copy.deepcopy(dict(affinity or {}))
    node_aff = out.setdefault("nodeAffinity", {})
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append({"key": _HOSTNAME, "operator": "NotIn", "values": list(avoid)})
    return out


def rank_pod(
    job: TrainingJob,
    rank: int,
    *,
    generation: int,
    config: PodConfig,
    layout: LayoutSpec | None = None,
    avoid_nodes: Iterable[str] = (),
) -> dict[str, Any]:
    """The Pod of ``rank`` at ``generation``: the trainer container plus the injected sidecar.

    Args:
        job: the validated TrainingJob read from the API server (``metadata.uid`` set).
        rank: global rank, ``0 <= rank < world size``.
        generation: the process-group generation this pod is created for (its label; the
            plan of that generation is in the catalog before the pod is created).
        config: operator-wide pod inputs (:class:`PodConfig`).
        layout: the current layout (differs from ``spec.layout`` after an elastic reshard);
            default ``spec.layout``. The world size is its product.
        avoid_nodes: nodes in cool-down for this job (a ``NotIn`` node-affinity term).

    Returns:
        A Pod dict meeting the ``restricted`` Pod Security Standard (:mod:`lifeline.api._security`:
        non-root, read-only root filesystem, no capabilities, RuntimeDefault seccomp; writable
        paths are the arena emptyDir at ``/dev/shm`` and an emptyDir at ``/tmp``). ``restartPolicy`` is ``OnFailure``: a crashed trainer restarts in place while
        its sidecar keeps the L0 copy (the cheapest recovery rung); a template's own
        ``restartPolicy`` is overridden for that reason. ``terminationGracePeriodSeconds``: the
        template's, else :data:`TERMINATION_GRACE_SECONDS`; both containers get it as ``LIFELINE_PREEMPT_GRACE_SECONDS``.

    Raises:
        ValueError: ``rank`` is outside ``[0, world size)``.
    """
    layout = layout or job.spec.layout
    world_size = layout.world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size}) for layout {layout.to_wire()}")
    name = job.metadata["name"]
    template = copy.deepcopy(job.spec.template)
    spec: dict[str, Any] = template.get("spec", {})
    meta: dict[str, Any] = template.get("metadata", {}) or {}
    labels = {
        **(meta.get("labels") or {}),
        LABEL_JOB: name,
        LABEL_RANK: str(rank),
        LABEL_GENERATION: str(generation),
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    if spec.get("terminationGracePeriodSeconds") is None:
        spec["terminationGracePeriodSeconds"] = TERMINATION_GRACE_SECONDS
    grace = int(spec["terminationGracePeriodSeconds"])  # not a number: ValueError/TypeError (an invalid spec)
    common = _common_env(job, rank, world_size, config) + (
        [_env("LIFELINE_PREEMPT_GRACE_SECONDS", PodSettings, str(grace))] if config.preemption else [])
    mount = {"name": ARENA_VOLUME, "mountPath": ARENA_MOUNT}
    tmp = {"name": TMP_VOLUME, "mountPath": TMP_MOUNT}

    containers = []
    trainer: dict[str, Any] = {}
    for c in spec.get("containers", []):
        if c.get("name") == TRAINER_CONTAINER:
            trainer = c
            c["env"] = _merge_env(c.get("env", []), copy.deepcopy(common) + _trainer_env(job, layout, config))
            mounts = [m for m in c.get("volumeMounts", [])
                      if m.get("name") not in (ARENA_VOLUME, TMP_VOLUME) and m.get("mountPath") != ARENA_MOUNT]
            own_tmp = any(m.get("mountPath") == TMP_MOUNT for m in mounts)
            c["volumeMounts"] = mounts + [mount] + ([] if own_tmp else [tmp])
            c["securityContext"] = with_defaults(c.get("securityContext"), restricted_container_context())
        containers.append(c)

    sidecar: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": config.sidecar_image or trainer.get("image", ""),
        "command": ["python", "-m", "lifeline", "sidecar"],
        "env": _shared_user_env(trainer) + common + _sidecar_env(job, config),
        "ports": [
            {"name": "peer", "containerPort": config.peer_port, "protocol": "TCP"},
            {"name": "sidecar-metrics", "containerPort": config.metrics_port, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": config.metrics_port},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "volumeMounts": [mount, tmp],
        "securityContext": restricted_container_context(),
    }
    if trainer.get("imagePullPolicy"):
        sidecar["imagePullPolicy"] = trainer["imagePullPolicy"]
    if config.sidecar_resources:
        sidecar["resources"] = copy.deepcopy(dict(config.sidecar_resources))
    containers.append(sidecar)

    arena: dict[str, Any] = {"medium": "Memory"}
    if job.spec.checkpoint.memory_limit is not None:
        arena["sizeLimit"] = str(job.spec.checkpoint.memory_limit)
    volumes = [v for v in spec.get("volumes", []) if v.get("name") not in (ARENA_VOLUME, TMP_VOLUME)]
    volumes.append({"name": ARENA_VOLUME, "emptyDir": arena})
    volumes.append({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}})

    spec["containers"] = containers
    spec["volumes"] = volumes
    spec["restartPolicy"] = "OnFailure"
    spec["securityContext"] = with_defaults(spec.get("securityContext"), restricted_pod_context())
    if config.service_account and not spec.get("serviceAccountName"):
        spec["serviceAccountName"] = config.service_account
    affinity = _avoid_nodes(spec.get("affinity"), avoid_nodes)
    if affinity is not None:
        spec["affinity"] = affinity

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, rank),
            "namespace": job.metadata.get("namespace"),
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
