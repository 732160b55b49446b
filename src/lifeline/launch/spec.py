"""Validate a TrainingJob for a local run before anything starts.

:func:`load_for_launch` adds to :func:`lifeline.api.load_trainingjob` (schema, replicas vs
layout, unknown fields, the ``trainer`` container) what only a launcher can check: the trainer
container has a command to run, and the reference model accepts the spec's model arguments and
layout. Every problem is a :class:`~lifeline.errors.ConfigError` whose ``field`` names the wire
path (``spec.layout.pipeline``, ``spec.model.args.d_model``, ...).

Which model a job runs (:func:`job_model`): ``spec.model.name`` when set; without a name, the
reference ``gpt-moe`` when the trainer container runs the reference trainer, else none (a script of
one's own, e.g. ``examples/ddp``). A model is checked only when its package registers a checker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from lifeline.api import TRAINER_CONTAINER, LayoutSpec, TrainingJob, load_trainingjob
from lifeline.errors import ConfigError

__all__ = ["MODEL_CHECKERS", "REFERENCE_MODELS", "load_for_launch", "trainer_argv", "check_model", "model_checker",
           "model_config", "job_model", "runs_reference_trainer"]

MODEL_CHECKERS = "lifeline.models"
"""The entry-point group of model checkers: ``name = "package.module:check"``, where ``check(args,
layout)`` raises :class:`~lifeline.errors.ConfigError` with ``field`` ``seed``, ``args.<name>`` or
``layout.<degree>`` (see :func:`lifeline.models.gpt_moe.check`)."""

REFERENCE_MODELS = ("gpt-moe", "gpt_moe")
"""``spec.model.name`` values that mean the reference GPT-MoE trainer (as does no name)."""

_REFERENCE_COMMANDS = (("-m", "lifeline", "trainer"), ("-m", "lifeline.models.gpt_moe"))


def _trainer_index(job: TrainingJob) -> int:
    containers = job.spec.template.get("spec", {}).get("containers", [])
    return next(i for i, c in enumerate(containers) if c.get("name") == TRAINER_CONTAINER)


def trainer_argv(job: TrainingJob) -> list[str]:
    """The trainer container's ``command + args`` as a local argv.

    A leading ``python``/``python3`` becomes :data:`sys.executable` (the launcher's interpreter, with
    Lifeline installed); a leading ``lifeline`` becomes ``sys.executable -m lifeline``.

    Raises:
        ConfigError: the container has neither ``command`` nor ``args`` (``field`` names it).
    """
    i = _trainer_index(job)
    container = job.spec.template["spec"]["containers"][i]
    argv = [str(a) for a in (container.get("command") or [])] + [str(a) for a in (container.get("args") or [])]
    if not argv:
        raise ConfigError(
            f"spec.template.spec.containers[{i}] ('{TRAINER_CONTAINER}') has no command: a local run executes "
            "it as a process; set e.g. command: [python, -m, lifeline, trainer]",
            field=f"spec.template.spec.containers[{i}].command", job=job.name)
    head = os.path.basename(argv[0])
    if head in ("python", "python3") or head.startswith("python3."):
        argv[0] = sys.executable
    elif head == "lifeline":
        argv = [sys.executable, "-m", "lifeline", *argv[1:]]
    return argv


def runs_reference_trainer(argv: list[str]) -> bool:
    """Whether ``argv`` (from :func:`trainer_argv`) runs the reference trainer (``python -m lifeline trainer``
    or ``python -m lifeline.models.gpt_moe``) rather than a command of one's own."""
    tail = tuple(argv[1:])
    return any(tail[: len(cmd)] == cmd for cmd in _REFERENCE_COMMANDS)


def job_model(job: TrainingJob, argv: list[str]) -> str | None:
    """The model the job runs: ``spec.model.name``; without one, ``gpt-moe`` when ``argv`` runs the
    reference trainer, else ``None`` (the job's own command and no named model: nothing to check)."""
    name = job.spec.model.name if job.spec.model else None
    if name is not None:
        return name
    return REFERENCE_MODELS[0] if runs_reference_trainer(argv) else None


def model_config(job: TrainingJob) -> Mapping[str, Any]:
    """The model settings handed to the trainer (``LIFELINE_MODEL``): ``{"seed": spec.seed, **model.args}``."""
    return {"seed": job.spec.seed, **(job.spec.model.args if job.spec.model else {})}


def model_checker(name: str | None) -> Callable[[Mapping[str, Any], Mapping[str, int]], None] | None:
    """The checker registered for model ``name`` (no name: the reference ``gpt-moe``) in the
    ``lifeline.models`` entry-point group, or ``None`` when no package registers one."""
    wanted = {"gpt_moe": "gpt-moe"}.get(name or "gpt-moe", name or "gpt-moe")
    found = entry_points(group=MODEL_CHECKERS, name=wanted)
    return next(iter(found)).load() if found else None


def check_model(job: TrainingJob, layout: LayoutSpec) -> None:
    """Check the job's model (:func:`job_model`) takes ``spec.model.args`` and ``layout``, with the
    checker its package registers (:func:`model_checker`; the reference model's imports torch). No
    model, or no checker registered for it: no check.

    Raises:
        ConfigError: an unknown or out-of-range model argument (``spec.model.args.<name>``,
            ``spec.seed``) or a layout the model cannot take (``spec.layout.<degree>``).
    """
    name = job_model(job, trainer_argv(job))
    checker = model_checker(name) if name is not None else None
    if checker is None:
        return
    try:
        checker(dict(model_config(job)), layout.to_wire())
    except ConfigError as err:
        name = err.field or "args"
        if name.startswith("layout."):
            field = f"spec.{name}"
            raise ConfigError(f"{field}: model {name!r} cannot take layout {layout.to_wire()}: {err.message}",
                              field=field, job=job.name) from None
        field = "spec.seed" if name == "seed" else f"spec.model.{name}"
        raise ConfigError(f"{field}: {err.message}", field=field, job=job.name) from None


def load_for_launch(source: Any, *, steps: int | None = None, layout: LayoutSpec | None = None) -> TrainingJob:
    """Load and validate a TrainingJob for ``lifeline run``; nothing is started.

    Args:
        source: a YAML path or a mapping (see :func:`lifeline.api.load_trainingjob`).
        steps: override ``spec.steps`` (``--steps``), >= 1.
        layout: check this layout instead of ``spec.layout`` (an elastic restart).

    Returns:
        The validated job (with ``steps`` applied).

    Raises:
        ConfigError: naming the field (see the module docstring).
    """
    job = load_trainingjob(source)
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}", field="--steps", job=job.name)
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"steps": steps})})
    if not job.name:
        raise ConfigError("metadata.name is required: it names the job's catalog keys and checkpoints",
                          field="metadata.name")
    trainer_argv(job)  # a ConfigError when the trainer container has no command
    check_model(job, layout or job.spec.layout)
    return job
