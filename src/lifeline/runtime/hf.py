"""Hugging Face ``transformers.Trainer`` under Lifeline: ``LifelineTrainer`` (docs/sdk.md).

A ``Trainer`` subclass whose :meth:`LifelineTrainer.train` runs the Trainer's own loop under
:func:`~lifeline.runtime.run_training`, the loop every Lifeline trainer runs: the Trainer's model,
optimizer, LR scheduler, ``TrainerState`` and the process's RNG are checkpointed through the
sidecar every ``checkpoint.every`` optimizer steps (the universal format of
:class:`~lifeline.runtime.StatefulState`), progress is reported after every step, and when a peer is
lost the rank recovers in its process: the Trainer's loop is unwound, the process group torn down
and rejoined, the plan's step restored, and the Trainer resumes from it through its own
``resume_from_checkpoint`` path (same epoch, same batches skipped, RNG restored where the Trainer
restores it), so a run with failures ends bit-identical to one without (CPU, seeded).

How: the Trainer's ``train()`` runs on a worker thread that parks at the end of every optimizer step
(a ``TrainerCallback.on_step_end``) until the runtime asks for the next one; the runtime saves while
it is parked, so a copy is always of a whole step. The ``resume_from_checkpoint`` directory the
Trainer is given after a restore holds only ``trainer_state.json``: the model, optimizer, scheduler
and RNG come from Lifeline's copy (the Trainer's file loaders are switched off for that directory).

Needs ``transformers`` and ``accelerate`` (the ``hf`` extra). Limits: the optimizer and LR scheduler
are created before the first step (``create_optimizer_and_scheduler``) so that a restore has
something to fill; ``args.max_steps`` is the TrainingJob's ``spec.steps``; DeepSpeed, FSDP and
gradient scalers are not covered (their state is outside what is saved here).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import queue
import random
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import TrainOutput

from lifeline.checkpoint import Layout, PatternRules
from lifeline.errors import ConfigError
from lifeline.runtime._checkpointer import Checkpointer
from lifeline.runtime._context import RuntimeContext
from lifeline.runtime._make import make_checkpointer
from lifeline.runtime._stateful import StatefulState, StateValues
from lifeline.runtime._training import TrainingSummary, run_training

__all__ = ["LifelineTrainer", "training_arguments"]

_STATE_FILE = "trainer_state.json"  # transformers.trainer_callback's TRAINER_STATE_NAME


class _Unwind(BaseException):
    """Raised in the worker thread to leave the Trainer's loop (a recovery or the end of the run)."""


@dataclass(frozen=True)
class _Outcome:
    step: int
    loss: float | None
    tokens: int
    seconds: float


class _Progress:
    """The Trainer's ``TrainerState`` (JSON) and the process's RNG at the saved step: a ``Stateful``.

    The RNG is not set on load: :meth:`LifelineTrainer._load_rng_state` sets it where the Trainer
    sets a checkpoint's RNG (after it skipped the trained batches), as its own resume does.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        np_state = np.random.get_state()
        return {"trainer_state": json.dumps(dataclasses.asdict(self.trainer.state), sort_keys=True),
                "rng_torch": torch.get_rng_state().numpy().tobytes(), "rng_python": repr(random.getstate()),
                "rng_numpy": [np_state[0], np_state[1].tobytes(), *map(float, np_state[2:])]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loaded = dict(state)

    def apply_rng(self) -> None:
        """Set the process's torch, Python and NumPy generators to the loaded step's."""
        if self.loaded is None:
            return
        torch.set_rng_state(torch.frombuffer(bytearray(self.loaded["rng_torch"]), dtype=torch.uint8))
        random.setstate(ast.literal_eval(self.loaded["rng_python"]))
        name, keys, pos, has_gauss, gauss = self.loaded["rng_numpy"]
        np.random.set_state((name, np.frombuffer(keys, dtype=np.uint32).copy(), int(pos), int(has_gauss), gauss))


class _Park(TrainerCallback):
    """Hands every finished optimizer step to the runtime and waits until it asks for the next."""

    def __init__(self, steps: _Steps) -> None:
        self.steps = steps

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> TrainerControl:
        self.steps.loss_before = float(self.steps.hf._tr_loss)  # the Trainer's running loss since its last log
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        self.steps.step_ended(state)
        return control


def training_arguments(ctx: RuntimeContext, **kwargs: Any) -> TrainingArguments:
    """``TrainingArguments`` for a Trainer under Lifeline: ``max_steps`` is the job's ``spec.steps``,
    ``seed`` its ``spec.seed``, ``save_strategy="no"`` (Lifeline saves), no reporting integrations, the
    CPU unless CUDA is there; ``kwargs`` add to or override the rest (``output_dir`` is required).

    It also sets the environment ``accelerate`` reads to find the job's process group, which
    :func:`~lifeline.runtime.init` has joined already: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (0:
    one rank per pod), ``LOCAL_WORLD_SIZE`` (1) and a ``MASTER_ADDR`` it requires but never uses.
    """
    os.environ.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    settings = {"max_steps": ctx.settings.steps, "seed": int(ctx.settings.model.get("seed", 0)),
                "save_strategy": "no", "report_to": "none", "use_cpu": not torch.cuda.is_available(),
                "disable_tqdm": True}
    return TrainingArguments(**{**settings, **kwargs})


class LifelineTrainer(Trainer):
    """A ``transformers.Trainer`` whose :meth:`train` runs under Lifeline (module docstring).

    Args:
        ctx: from :func:`~lifeline.runtime.init`, called before the ``TrainingArguments`` are made
            (it joins the process group the Trainer's ``accelerate`` then uses).
        *args, **kwargs: ``Trainer``'s. ``args.max_steps`` must equal the TrainingJob's ``spec.steps``;
            ``args.save_strategy`` should be ``"no"`` (Lifeline saves).
        every: steps between checkpoints (default ``checkpoint.every``).
        rules: tensor patterns, default all replicated (data parallelism).
        checkpointer: default :func:`~lifeline.runtime.make_checkpointer` for ``ctx``.

    Raises:
        ConfigError: ``args.max_steps`` differs from the job's steps.
    """

    def __init__(self, ctx: RuntimeContext, *args: Any, every: int | None = None, rules: PatternRules | None = None,
                 checkpointer: Checkpointer | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        steps = ctx.settings.steps
        if self.args.max_steps != steps:
            raise ConfigError(f"TrainingArguments.max_steps={self.args.max_steps} but the TrainingJob has "
                              f"spec.steps={steps}: pass max_steps=ctx.settings.steps", field="max_steps",
                              job=ctx.job)
        self.lifeline, self.every = ctx, every if every is not None else ctx.settings.checkpoint_every
        self.lifeline_checkpointer = checkpointer if checkpointer is not None else make_checkpointer(
            ctx.settings, ctx.layout, rules if rules is not None else PatternRules())
        self.lifeline_summary: TrainingSummary | None = None
        self._steps = _Steps(self)
        self.add_callback(_Park(self._steps))

    def train(self, resume_from_checkpoint: Any = None, **kwargs: Any) -> TrainOutput:  # type: ignore[override]
        """Train ``args.max_steps`` optimizer steps under Lifeline; returns the Trainer's ``TrainOutput``.

        ``resume_from_checkpoint`` must be unset: Lifeline restores by itself (the plan's step, else
        the latest complete checkpoint). :attr:`lifeline_summary` holds the runtime's summary after.

        Raises:
            ConfigError: ``resume_from_checkpoint`` given.
            RecoveryError: no recovery plan came in time, or a restore failed.
        """
        if resume_from_checkpoint not in (None, False):
            raise ConfigError("LifelineTrainer.train(resume_from_checkpoint=...): Lifeline restores by itself; "
                              "leave it unset", field="resume_from_checkpoint", job=self.lifeline.job)
        self.create_optimizer_and_scheduler(num_training_steps=self.args.max_steps)
        self._created_lr_scheduler = False  # kept across the Trainer's train() calls: its state is checkpointed
        self._steps.begin(kwargs)
        self.lifeline_summary = run_training(self.lifeline, _OneTrainer(self._steps), self.lifeline_checkpointer,
                                             self.args.max_steps, self.every)
        return self._steps.finish()

    def _trainer_loop(self, resume: str | None, kwargs: Mapping[str, Any]) -> TrainOutput:
        """The Trainer's own ``train()`` (run on :class:`_Steps`'s worker thread)."""
        self.model_wrapped = self.model
        self._created_lr_scheduler = False  # else the Trainer makes a new one (step 0) on every train() call
        return super().train(resume_from_checkpoint=resume, **kwargs)

    def _drop_wrappers(self) -> None:
        """Drop what holds the old process group: the ``DistributedDataParallel`` wrapper and
        ``accelerate``'s prepared objects (a live reference keeps the old group's sockets open)."""
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        self.optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        self.lr_scheduler = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)

    # --- the Trainer's own loaders, switched off for Lifeline's resume directory --------------------
    def _lifeline_resume(self, checkpoint: Any) -> bool:
        return checkpoint is not None and str(checkpoint) == self._steps.resume_dir

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if not self._lifeline_resume(resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        if not self._lifeline_resume(checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint: Any) -> None:
        if not self._lifeline_resume(checkpoint):
            super()._load_scaler(checkpoint)

    def _load_rng_state(self, checkpoint: Any) -> None:
        if self._lifeline_resume(checkpoint):
            self._steps.progress.apply_rng()
        else:
            super()._load_rng_state(checkpoint)


class _Steps:
    """The runtime's :class:`~lifeline.runtime.Trainable` over a :class:`LifelineTrainer`: each
    ``train_step()`` lets the Trainer's loop (on a worker thread) run one optimizer step."""

    def __init__(self, hf: LifelineTrainer) -> None:
        self.hf = hf
        self.step = 0
        self.progress = _Progress(hf)
        self.resume_dir: str | None = None
        self._resume_root = Path(tempfile.mkdtemp(prefix="lifeline-hf-resume-"))
        self._worker: threading.Thread | None = None
        self._to_worker: queue.Queue[bool] = queue.Queue()
        self._to_runtime: queue.Queue[_Outcome | BaseException | TrainOutput] = queue.Queue()
        self._kwargs: Mapping[str, Any] = {}
        self._t0 = 0.0
        self.loss_before = 0.0

    def begin(self, kwargs: Mapping[str, Any]) -> None:
        """Take the objects to checkpoint (the optimizer and scheduler exist now) and the step-0 state."""
        hf = self.hf
        self._kwargs = kwargs
        self.states = StatefulState({"model": hf.model, "optim": hf.optimizer, "sched": hf.lr_scheduler,
                                     "trainer": self.progress}, rng=False)
        self.initial = self.states.snapshot(0)

    def connect(self, timeout: timedelta | None = None) -> None:
        """Nothing: the Trainer wraps the model in ``DistributedDataParallel`` when its loop starts."""

    def disconnect(self) -> None:
        """Unwind the Trainer's loop (parked or failed) and drop its process-group wrappers."""
        self._stop_worker()
        self.hf._drop_wrappers()

    def train_step(self) -> _Outcome:
        """Let the Trainer run one optimizer step; raises what its loop raised (a collective error)."""
        if self._worker is None:
            self._t0 = time.perf_counter()
            self._worker = threading.Thread(target=self._run, name="lifeline-hf-trainer", daemon=True)
            self._worker.start()
        else:
            self._t0 = time.perf_counter()
            self._to_worker.put(True)
        got = self._to_runtime.get()
        if isinstance(got, BaseException):
            self._worker.join()
            self._worker = None
            raise got
        if isinstance(got, TrainOutput):
            self._worker = None
            raise ConfigError(f"the Trainer ended at step {self.hf.state.global_step} before the job's "
                              f"{self.hf.args.max_steps} steps (a dataset too short for max_steps?)",
                              field="max_steps", job=self.hf.lifeline.job)
        self.step = got.step
        return got

    def state(self) -> dict[str, Tensor | bytes]:
        """The checkpoint state now (the Trainer's loop is parked between two steps)."""
        return self.states.values(self.step)

    def restore_state(self) -> dict[str, Tensor | bytes]:
        """The template a restore fills."""
        return self.states.template(self.step)

    def initial_state(self) -> dict[str, Tensor | bytes]:
        """The state before the first step (a restart from scratch)."""
        return self.initial

    def load_state(self, values: StateValues) -> None:
        """Load ``values`` and prepare the Trainer's resume at their step (its ``trainer_state.json``)."""
        self._stop_worker()
        self.step = self.states.load(values)
        self.resume_dir = None
        if self.step > 0 and self.progress.loaded is not None:
            folder = self._resume_root / f"step-{self.step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / _STATE_FILE).write_text(self.progress.loaded["trainer_state"])
            self.resume_dir = str(folder)

    def step_ended(self, state: TrainerState) -> None:
        """On the worker thread, after each optimizer step: hand it over, wait for the next or unwind."""
        loss = float(self.hf._tr_loss) - self.loss_before  # this step's micro-batch losses
        tokens = self.hf.args.per_device_train_batch_size * self.hf.args.gradient_accumulation_steps \
            * self.hf.lifeline.world_size
        self._to_runtime.put(_Outcome(state.global_step, loss, tokens, time.perf_counter() - self._t0))
        if not self._to_worker.get():
            raise _Unwind()

    def finish(self) -> TrainOutput:
        """Let the parked Trainer end its loop (its logs and ``on_train_end`` callbacks)."""
        worker, self._worker = self._worker, None
        if worker is None:
            return TrainOutput(self.hf.state.global_step, 0.0, {})
        self._to_worker.put(True)
        got = self._to_runtime.get()
        worker.join()
        if isinstance(got, BaseException):
            raise got
        return got

    def _run(self) -> None:
        try:
            self._to_runtime.put(self.hf._trainer_loop(self.resume_dir, self._kwargs))
        except _Unwind:
            pass
        except BaseException as err:  # noqa: BLE001 - handed to the runtime's thread
            self._to_runtime.put(err)

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None or not worker.is_alive():
            return
        self._to_worker.put(False)
        worker.join()


@dataclass
class _OneTrainer:
    """The model spec of a Trainer script: its one trainer, whatever the layout."""

    trainer: _Steps

    def build(self, layout: Layout, rank: int) -> _Steps:
        return self.trainer
