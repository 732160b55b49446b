"""A rank's two processes (sidecar and trainer) from the same pod the operator would create.

:func:`rank_processes` renders the rank's Pod with :func:`lifeline.api.manifests.rank_pod`
— the operator's own builder, so a local run gets exactly the ``LIFELINE_*`` settings a
Kubernetes pod gets — and resolves what the kubelet would: the downward API (``spec.nodeName``
→ the launcher's node name, ``status.podIP`` → the node's loopback address) and the job
Secret's keys (HMAC key, S3 credentials). Only the Kubernetes-specific parts are local: the
arena directory is per "pod" (a fresh one for every replacement, like an emptyDir), the
sidecar's peer port is picked free (it registers it in the catalog) and its metrics endpoint is
off unless asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifeline.api import TRAINER_CONTAINER, LayoutSpec, TrainingJob
from lifeline.api.manifests import (
    SECRET_HMAC_KEY,
    SECRET_REDIS_PASSWORD,
    SECRET_REDIS_USERNAME,
    SECRET_S3_ACCESS_KEY,
    SECRET_S3_SECRET_KEY,
    SIDECAR_CONTAINER,
    PodConfig,
    rank_pod,
)
from lifeline.errors import ConfigError
from lifeline.launch.spec import trainer_argv

__all__ = ["Secrets", "ProcessSpec", "RankProcesses", "rank_processes", "node_ip", "LOCAL_ENV"]

LOCAL_ENV: Mapping[str, str] = {
    "GLOO_SOCKET_IFNAME": "lo",  # every "pod IP" is a loopback address
    "OMP_NUM_THREADS": "1",  # ranks share the machine's cores
}
"""Variables set for every local process (the user's template env and ours win over them)."""


@dataclass(frozen=True)
class Secrets:
    """The job Secret's values (``hmac_key`` >= 16 characters; S3 and Redis credentials may be empty)."""

    hmac_key: str
    s3_access_key: str = ""
    s3_secret_key: str = ""
    redis_username: str = ""
    redis_password: str = ""

    def get(self, key: str) -> str:
        """The value of Secret key ``key`` (``hmac-key``, ``s3-access-key``, ``s3-secret-key``,
        ``redis-username``, ``redis-password``)."""
        return {SECRET_HMAC_KEY: self.hmac_key, SECRET_S3_ACCESS_KEY: self.s3_access_key,
                SECRET_S3_SECRET_KEY: self.s3_secret_key, SECRET_REDIS_USERNAME: self.redis_username,
                SECRET_REDIS_PASSWORD: self.redis_password}[key]


@dataclass(frozen=True)
class ProcessSpec:
    """One container as a local process: ``argv`` and the complete environment ``env``."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True)
class RankProcesses:
    """The two processes of one rank's "pod" on ``node`` (loopback address ``pod_ip``)."""

    rank: int
    node: str
    pod_ip: str
    arena_dir: Path
    sidecar: ProcessSpec
    trainer: ProcessSpec


def node_ip(index: int) -> str:
    """The loopback "pod IP" of the ``index``-th node: ``127.0.0.<index + 2>`` (index < 250)."""
    if not 0 <= index < 250:
        raise ConfigError(f"node index {index} outside [0, 250): the launcher has 250 loopback addresses",
                          field="nodes")
    return f"127.0.0.{index + 2}"


def _resolve(env: list[dict[str, Any]], *, node: str, pod_ip: str, secrets: Secrets, container: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for var in env:
        name = var["name"]
        if "value" in var:
            out[name] = str(var["value"])
            continue
        source = var.get("valueFrom") or {}
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            values = {"spec.nodeName": node, "status.podIP": pod_ip, "status.hostIP": pod_ip}
            if path not in values:
                raise ConfigError(f"container {container}: env {name} reads fieldRef {path}, which a local run "
                                  "cannot provide", field=f"env.{name}")
            out[name] = values[path]
        elif "secretKeyRef" in source:
            out[name] = secrets.get(source["secretKeyRef"]["key"])
        else:
            raise ConfigError(f"container {container}: env {name} uses {sorted(source)}; a local run resolves "
                              "value, fieldRef and the job Secret only", field=f"env.{name}")
    return out


def rank_processes(
    job: TrainingJob,
    rank: int,
    *,
    layout: LayoutSpec,
    generation: int,
    node: str,
    pod_ip: str,
    arena_dir: Path,
    redis_url: str,
    secrets: Secrets,
    persist_uri: str | None = None,
    s3_endpoint: str = "",
    metrics_port: int = -1,
    extra_env: Mapping[str, str] | None = None,
) -> RankProcesses:
    """The sidecar and trainer processes of ``rank`` in ``layout``, as the operator's pod defines them.

    Args:
        job: the validated TrainingJob.
        rank: global rank in ``layout``.
        layout: the current layout (the spec's, or the smaller one after an elastic reshard).
        generation: the generation the "pod" is created for (pod label; the runtime joins the
            catalog's current generation).
        node, pod_ip: the local "node" name and its loopback address.
        arena_dir: the pod's Memory-backed directory (arena slots and the Unix socket).
        redis_url: the catalog.
        secrets: the job Secret's values.
        persist_uri: replaces ``spec.checkpoint.persist.uri`` (the launcher's L2 store); ``None``
            keeps the spec's.
        s3_endpoint: ``host:port`` of object storage for ``s3://`` URIs.
        metrics_port: the sidecar's ``/metrics`` port (-1: off, 0: a free one).
        extra_env: variables added to both processes (before ours, after the inherited ones).

    Returns:
        :class:`RankProcesses`; each environment is the launcher's own (minus ``LIFELINE_*``),
        then :data:`LOCAL_ENV`, ``extra_env``, and the pod's container env.

    Raises:
        ConfigError: the template uses env sources a local run cannot resolve, or has no command.
    """
    if persist_uri is not None and job.spec.checkpoint.persist is not None:
        ck = job.spec.checkpoint
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"checkpoint": ck.model_copy(
            update={"persist": ck.persist.model_copy(update={"uri": persist_uri})})})})
    job = job.model_copy(update={"metadata": {**job.metadata, "uid": job.metadata.get("uid", "local")}})
    # preemption handling only with a ``preempt`` injection (its grace comes in ``extra_env``)
    config = PodConfig(redis_url=redis_url, s3_endpoint=s3_endpoint, peer_port=0, metrics_port=metrics_port,
                       preemption=False)
    pod = rank_pod(job, rank, generation=generation, config=config, layout=layout)
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIFELINE_")}
    base.update(LOCAL_ENV)
    base.update(extra_env or {})
    local = {"LIFELINE_ARENA_DIR": str(arena_dir)}

    def spec_of(name: str, argv: list[str]) -> ProcessSpec:
        env = dict(base)
        env.update(_resolve(containers[name].get("env", []), node=node, pod_ip=pod_ip, secrets=secrets,
                            container=name))
        env.update(local)
        return ProcessSpec(tuple(argv), env)

    sidecar_cmd = list(containers[SIDECAR_CONTAINER]["command"])
    if sidecar_cmd[:1] == ["python"]:
        sidecar_cmd[0] = sys.executable
    return RankProcesses(
        rank=rank, node=node, pod_ip=pod_ip, arena_dir=arena_dir,
        sidecar=spec_of(SIDECAR_CONTAINER, sidecar_cmd),
        trainer=spec_of(TRAINER_CONTAINER, trainer_argv(job)),
    )
