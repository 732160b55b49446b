"""Everything ``lifeline run`` checks before it starts anything (docs/cli.md).

:func:`check_run` validates the spec (:func:`lifeline.launch.spec.load_for_launch`), every flag, the
failure injections, the L2 URI (its scheme, an S3 bucket name, that a file store can be created,
S3 credentials for ``--s3-endpoint``), the state dir, and what this machine can run: at most
:data:`RANKS_PER_CORE` ranks per core (every rank is a sidecar and a trainer process) and arena
slots of every rank within the memory available (``MemAvailable`` of /proc/meminfo). It reports
every problem at once, in one :class:`~lifeline.errors.ConfigError`, and writes nothing: the only
probe is a temporary directory created and removed where a file store or the state dir will go.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lifeline.api import TrainingJob
from lifeline.api.trainingjob import check_persist_uri
from lifeline.errors import ConfigError
from lifeline.launch._health import parse_unhealthy
from lifeline.launch.inject import Injection, parse_injection
from lifeline.launch.spec import load_for_launch

__all__ = ["RANKS_PER_CORE", "DEFAULT_SLOTS", "RunPlan", "check_run", "s3_credentials", "available_memory",
           "raise_all"]

RANKS_PER_CORE = 16
"""A local run takes at most this many ranks per core (``os.cpu_count()``): a generous bound, since
each rank is two processes (a sidecar and a trainer) plus a pre-warmed spare."""

DEFAULT_SLOTS = 3
"""Arena slots per rank unless the trainer container sets ``LIFELINE_SLOTS`` (see lifeline.api.pod)."""


@dataclass(frozen=True)
class RunPlan:
    """What :func:`check_run` found valid: the job, its injections, the state dir (not created) and the
    nodes whose health check is made to fail."""

    job: TrainingJob
    injections: tuple[Injection, ...]
    state_dir: Path
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    """``--unhealthy-node`` faults: ``{node: compute|slow|network}``."""


def raise_all(problems: list[tuple[str, str]], **context: object) -> None:
    """Raise one :class:`ConfigError` listing every ``(field, message)`` (``field`` of the first); no-op if empty."""
    if problems:
        raise ConfigError("; ".join(m for _, m in problems), field=problems[0][0], **context)


def s3_credentials() -> tuple[str, str]:
    """``(access_key, secret_key)`` from ``LIFELINE_S3_ACCESS_KEY``/``LIFELINE_S3_SECRET_KEY``, falling back
    to ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``""`` when unset)."""
    env = os.environ
    return (env.get("LIFELINE_S3_ACCESS_KEY") or env.get("AWS_ACCESS_KEY_ID", ""),
            env.get("LIFELINE_S3_SECRET_KEY") or env.get("AWS_SECRET_ACCESS_KEY", ""))


def available_memory() -> int | None:
    """Bytes of memory available (``MemAvailable`` in /proc/meminfo), ``None`` where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _creatable(path: Path) -> str | None:
    """Why a directory cannot be made (or used) at ``path``; probes with a temporary directory, removed."""
    anc = path
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{anc} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lifeline-probe-", dir=anc))
    except OSError as err:
        return f"cannot create directories in {anc} ({err.strerror})"
    return None


def _template_env(job: TrainingJob) -> dict[str, str]:
    env = job.spec.trainer_container().get("env") or []
    return {e["name"]: str(e["value"]) for e in env if isinstance(e, dict) and "name" in e and "value" in e}


def _machine(job: TrainingJob, slot_mib: int, problems: list[tuple[str, str]]) -> None:
    ranks, cores = job.spec.layout.world_size, os.cpu_count() or 1
    if ranks > RANKS_PER_CORE * cores:
        problems.append(("spec.replicas", f"spec.replicas ({ranks}) is more ranks than this machine can run: a local "
                         f"run takes at most {RANKS_PER_CORE} ranks per core ({cores} cores: "
                         f"{RANKS_PER_CORE * cores}); use fewer ranks or run the job on Kubernetes"))
        return
    env = _template_env(job)
    try:
        slots = int(env.get("LIFELINE_SLOTS", DEFAULT_SLOTS))
        slot_bytes = int(env["LIFELINE_SLOT_BYTES"]) if "LIFELINE_SLOT_BYTES" in env else slot_mib << 20
    except ValueError:
        return  # the sidecar's settings report it, naming the variable
    need, have = slots * slot_bytes * ranks, available_memory()
    if have is not None and need > have:
        field = "--slot-mib" if "LIFELINE_SLOT_BYTES" not in env else "spec.template (LIFELINE_SLOT_BYTES)"
        problems.append((field, f"{field}: arena slots need {slots} slots x {slot_bytes >> 20} MiB x {ranks} ranks = "
                         f"{need >> 20} MiB, more than the {have >> 20} MiB of memory available; use a smaller slot "
                         "size or fewer ranks"))


def _flags(*, steps: int | None, timeout: float | None, slot_mib: int, spare_nodes: int | None,
           spares_per_node: int, standby_nodes: int, node_return_seconds: float | None = None) -> list[tuple[str, str]]:
    out = []
    if node_return_seconds is not None and not node_return_seconds > 0:
        out.append(("--node-return-seconds", f"--node-return-seconds must be > 0 seconds (leave it out to keep lost "
                    f"nodes lost), got {node_return_seconds:g}"))
    if steps is not None and steps < 1:
        out.append(("--steps", f"--steps must be >= 1, got {steps}"))
    if timeout is not None and not timeout > 0:
        out.append(("--timeout", f"--timeout must be > 0 seconds (leave it out for no limit), got {timeout:g}"))
    if slot_mib < 1:
        out.append(("--slot-mib", f"--slot-mib must be >= 1 (MiB per arena slot), got {slot_mib}"))
    for flag, value in (("--spare-nodes", spare_nodes), ("--spares-per-node", spares_per_node),
                        ("--standby-nodes", standby_nodes)):
        if value is not None and value < 0:
            out.append((flag, f"{flag} must be >= 0 (0 turns it off), got {value}"))
    return out


def _l2(job: TrainingJob | None, persist_uri: str | None, s3_endpoint: str) -> list[tuple[str, str]]:
    uri = persist_uri or (job.spec.checkpoint.persist.uri if job is not None and job.spec.checkpoint.persist else None)
    if uri is None:
        return []
    field = "--persist-uri" if persist_uri else "spec.checkpoint.persist.uri"
    if persist_uri and "://" not in uri:
        uri = f"file://{Path(uri).resolve()}"
    problem = check_persist_uri(uri, field)
    if problem:
        return [(field, problem)]
    if uri.startswith("file://"):
        why = _creatable(Path(uri[len("file://"):]))
        return [(field, f"{field} {uri!r}: {why}; choose a writable path")] if why else []
    if s3_endpoint and not all(s3_credentials()):
        return [("--s3-endpoint", "--s3-endpoint needs credentials: set LIFELINE_S3_ACCESS_KEY and "
                 "LIFELINE_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")]
    return []


def _injections_fit(job: TrainingJob, injections: list[Injection], persist_uri: str | None,
                    s3_endpoint: str) -> list[tuple[str, str]]:
    """Injections the run cannot carry out: an outage of a MinIO it does not start, a flip at a tier
    the job does not use."""
    uri = persist_uri or (job.spec.checkpoint.persist.uri if job.spec.checkpoint.persist else None)
    own_minio = uri is not None and uri.startswith("s3://") and not s3_endpoint
    out = []
    for inj in injections:
        if inj.kind == "minio" and not own_minio:
            out.append(("--inject-failure", f"--inject-failure {inj}: the run starts no MinIO to take down; use an "
                        "s3:// L2 URI (spec.checkpoint.persist.uri or --persist-uri) without --s3-endpoint"))
        if inj.kind == "flip" and inj.tier == "L2" and uri is None:
            out.append(("--inject-failure", f"--inject-failure {inj}: the job has no L2 store; set "
                        "spec.checkpoint.persist or --persist-uri"))
        if inj.kind == "nan" and not job.spec.recovery.loss_spike.enabled:
            out.append(("--inject-failure", f"--inject-failure {inj}: the job does not check its steps for NaN; "
                        "set spec.recovery.lossSpike.enabled: true"))
        if inj.kind == "flip" and inj.tier == "L1" and job.spec.checkpoint.peer_replicas < 1:
            out.append(("--inject-failure", f"--inject-failure {inj}: the job keeps no L1 copies; set "
                        "spec.checkpoint.peerReplicas >= 1"))
    return out


def check_run(source: str | os.PathLike[str], *, steps: int | None = None, state_dir: Path | None = None,
              inject: list[str] | tuple[str, ...] = (), persist_uri: str | None = None, s3_endpoint: str = "",
              spare_nodes: int | None = None, slot_mib: int = 64, spares_per_node: int = 1, standby_nodes: int = 1,
              timeout: float | None = None, node_return_seconds: float | None = None,
              unhealthy: list[str] | tuple[str, ...] = ()) -> RunPlan:
    """Validate a ``lifeline run`` (the spec file ``source`` and every flag, named as on the command line).

    Returns:
        The :class:`RunPlan`; ``state_dir`` defaults to ``.state/run/<metadata.name>``.

    Raises:
        ConfigError: every problem found, ``"; "``-joined on one line; ``field`` names the first.
    """
    problems = _flags(steps=steps, timeout=timeout, slot_mib=slot_mib, spare_nodes=spare_nodes,
                      spares_per_node=spares_per_node, standby_nodes=standby_nodes,
                      node_return_seconds=node_return_seconds)
    job: TrainingJob | None = None
    try:
        job = load_for_launch(source, steps=steps if steps is None or steps >= 1 else None)
    except ConfigError as err:
        problems.insert(0, (err.field or "JOB", err.message))
    injections = []
    for text in inject:
        if "," in text:
            problems.append(("--inject-failure", f"--inject-failure {text!r}: one failure per flag; repeat the flag, "
                             "e.g. --inject-failure trainer:rank=1:step=5 --inject-failure node:rank=2:step=9"))
            continue
        try:
            injections.append(parse_injection(text, world_size=job.spec.layout.world_size if job else None,
                                              steps=job.spec.steps if job else None))
        except ConfigError as err:
            problems.append(("--inject-failure", err.message))
    problems += _l2(job, persist_uri, s3_endpoint)
    if job is not None:
        problems += _injections_fit(job, injections, persist_uri, s3_endpoint)
    if job is not None:
        _machine(job, max(slot_mib, 1), problems)
    faults: dict[str, str] = {}
    if job is not None and unhealthy:
        world = job.spec.layout.world_size
        nodes = [f"node-{i}" for i in range(world + (world if spare_nodes is None else max(spare_nodes, 0)))]
        try:
            faults = parse_unhealthy(unhealthy, nodes)
        except ConfigError as err:
            problems.append(("--unhealthy-node", err.message))
        if any(f.endswith(":rejoin") for f in faults.values()) and node_return_seconds is None:
            problems.append(("--unhealthy-node", "--unhealthy-node NODE:KIND:rejoin fails the check of a node that "
                             "comes back, and no node comes back: add --node-return-seconds S"))
        if not job.spec.recovery.health_check.enabled:
            problems.append(("--unhealthy-node", "--unhealthy-node fails a node's health check, which this job does "
                             "not run: set spec.recovery.healthCheck.enabled: true"))
    target = state_dir or (Path(".state") / "run" / str(job.name) if job is not None else None)
    if target is not None:
        if target.exists() and not target.is_dir():
            problems.append(("--state-dir", f"--state-dir {target} is not a directory"))
        elif (why := _creatable(target)) is not None:
            problems.append(("--state-dir", f"--state-dir {target}: {why}"))
    raise_all(problems, job=job.name if job is not None else None)
    assert job is not None and target is not None
    return RunPlan(job, tuple(injections), target, faults)
