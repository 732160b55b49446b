"""Localized replay and sparse checkpoints for a ``torch.distributed.pipelining`` training script.

:class:`Pipeline` names the rank's ``PipelineStage`` and schedule (and, in one call, the experts
and routers of a MoE stage); :func:`~lifeline.runtime.train` given ``pipeline=`` runs the script's
step function under a :class:`PipelineTrainer`, which provides the hooks the runtime's localized
replay and sparse windows need (:class:`~lifeline.runtime.LogsUpstream`,
:class:`~lifeline.runtime.SparseOperators`), the same ones the reference trainer implements:

* live, every tensor the stage sends is recorded in the rank's upstream log
  (:class:`~lifeline.runtime._pipelining.PipelineBoundary`);
* ``replay_step(source)`` runs the script's own step function for the next step with every receive
  read from the neighbours' logs and no send: the schedule's forwards and backwards
  (``torch.autograd.backward(outputs, grad_tensors=logged)`` inside the stage), then the script's
  optimizer and LR-scheduler steps — the step the failed rank ran, bit for bit;
* ``abandon_step()`` drops the partial work of an interrupted step (a survivor keeps its state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor

from lifeline.checkpoint import OperatorMembers
from lifeline.errors import ConfigError
from lifeline.runtime._loop import StatefulTrainer, StepFn, StepOutcome
from lifeline.runtime._operators import Operators
from lifeline.runtime._pipelining import PipelineBoundary
from lifeline.runtime._stateful import Stateful, StateValues

__all__ = ["Pipeline", "PipelineTrainer", "check_deterministic"]


class Pipeline:
    """The rank's stage of a ``torch.distributed.pipelining`` pipeline, for :func:`~lifeline.runtime.train`.

    Args:
        stage: the rank's ``PipelineStage``, built with ``input_args`` and ``output_args`` (static
            shapes) and ``stage_index`` equal to the rank's pipeline coordinate in the job's layout.
        schedule: its single-stage schedule (``ScheduleGPipe`` or ``Schedule1F1B``).
        experts, routers, counts, layer: the stage's MoE operators, see :meth:`~lifeline.runtime.Operators.moe`
            (``None``: every module holding parameters is one dense operator).

    Raises:
        ConfigError: see :class:`~lifeline.runtime._pipelining.PipelineBoundary`.
    """

    def __init__(self, stage: Any, schedule: Any, *, experts: str | None = None, routers: str | None = None,
                 counts: Callable[[], Mapping[tuple[int, int], int]] | None = None, layer: int = 0) -> None:
        self.boundary = PipelineBoundary(stage, schedule)
        self.stage, self.schedule = stage, schedule
        self.experts, self.routers, self.counts, self.layer = experts, routers, counts, layer

    def clip_grad_norm_(self, parameters: Iterable[Tensor], max_norm: float) -> Tensor:
        """Clip this stage's gradients to a global L2 norm of ``max_norm`` over every stage, replayable
        (call it in the step function, after ``schedule.step``, on every stage; see
        :meth:`~lifeline.runtime._pipelining.PipelineBoundary.clip_grad_norm_`). Returns the global
        norm (float64 scalar tensor). Raises :class:`~lifeline.errors.RecoveryError` when a replay diverged."""
        return self.boundary.clip_grad_norm_(parameters, max_norm)

    def trainer(self, states: Mapping[str, Stateful], step_fn: StepFn, *, replay: bool = False,
                stage: int | None = None, **options: Any) -> PipelineTrainer:
        """The :class:`PipelineTrainer` of ``states`` and ``step_fn`` (``options``: see it) on this pipeline;
        ``stage``: the rank's pipeline coordinate in the job's layout (checked against ``stage_index``).

        Raises:
            ConfigError: ``stage`` is not the ``PipelineStage``'s ``stage_index`` (the upstream log is keyed
                by the layout's stage), or ``replay`` (upstream logging on: the job may replay a step) and
                the model cannot replay bit for bit (:func:`check_deterministic`).
        """
        if stage is not None and stage != self.boundary.index:
            raise ConfigError(f"PipelineStage stage_index {self.boundary.index} on a rank of pipeline stage {stage}: "
                              "give each rank the stage of its layout coordinate", field="stage", key=str(stage))
        if replay:
            check_deterministic(states, rng=options.get("rng", True))
        return PipelineTrainer(self, states, step_fn, **options)

    def operators(self, states: Mapping[str, Stateful]) -> Operators:
        """The sparse-checkpoint registry of ``states`` with this pipeline's experts named."""
        ops = Operators(states)
        if self.experts is not None:
            ops.moe(experts=self.experts, routers=self.routers, counts=self.counts, layer=self.layer)
        return ops


def check_deterministic(states: Mapping[str, Stateful], *, rng: bool) -> None:
    """What a bit-identical replay needs, checked before the first step.

    Raises:
        ConfigError: ``torch.use_deterministic_algorithms(True)`` was not called, or a module has a
            dropout layer (its masks come from the RNG) while the RNG is not checkpointed (``rng=False``).
    """
    if not torch.are_deterministic_algorithms_enabled():
        raise ConfigError("localized replay recomputes steps bit for bit: call torch.use_deterministic_algorithms(True) "
                          "(and a fixed torch.set_num_threads) before lifeline.train", field="recovery.localizedReplay")
    for name, obj in states.items():
        if not rng and isinstance(obj, torch.nn.Module) and any(
                isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in obj.modules()):
            raise ConfigError(f"module {name!r} has dropout but the RNG is not checkpointed (rng=False): a replay "
                              "would draw other masks", field="states", key=name)


class PipelineTrainer(StatefulTrainer):
    """A :class:`~lifeline.runtime.StatefulTrainer` whose step function runs a pipeline schedule,
    with upstream logging, localized replay and sparse operators (see the module docstring).

    Args:
        pipeline: the rank's :class:`Pipeline`.
        states, step_fn, connect, disconnect, tokens_per_step, rng: see :class:`StatefulTrainer`.
            ``step_fn(step)`` must call ``schedule.step(...)`` once with the inputs (first stage) and
            targets (last stage) of ``step``, then the optimizer and LR scheduler; it may run no other
            collective (a replay runs it on the failed stage alone).
    """

    def __init__(self, pipeline: Pipeline, states: Mapping[str, Stateful], step_fn: StepFn, *,
                 connect: Callable[[timedelta | None], None] | None = None,
                 disconnect: Callable[[], None] | None = None, tokens_per_step: int = 0, rng: bool = True) -> None:
        super().__init__(states, step_fn, connect=connect, disconnect=disconnect, tokens_per_step=tokens_per_step,
                         rng=rng)
        self.pipeline, self.boundary = pipeline, pipeline.boundary
        self.registry = pipeline.operators(states)
        self._modules = [m for m in states.values() if isinstance(m, torch.nn.Module)]
        self.prefix = f"stages.{self.boundary.index}."
        """Put before every tensor entry: the stages' modules reuse names (``model.block.ln1.weight``) and
        the universal format names each logical tensor once across the job."""
        self.initial = self._tag(self.initial)

    @property
    def log(self) -> Any:
        """The rank's upstream log (set by the runtime), or ``None``."""
        return self.boundary.log

    @log.setter
    def log(self, value: Any) -> None:
        self.boundary.log = value

    def train_step(self) -> StepOutcome:
        """Run the next step live (sends and receives over the process group), logging what is sent."""
        self.boundary.iteration, self.boundary.source = self.step, None
        return super().train_step()

    def replay_step(self, source: Any) -> StepOutcome:
        """Recompute the next step from the neighbours' upstream logs (``source.fetch``); nothing is
        sent, what would be sent is logged again.

        Raises:
            RecoveryError: a neighbour's entry is gone (from ``source``).
        """
        self.boundary.iteration, self.boundary.source = self.step, source
        try:
            return super().train_step()
        finally:
            self.boundary.source = None

    def abandon_step(self) -> None:
        """Drop the partial work of an interrupted step (receive buffers, cached activations, gradients);
        the state stays that of the last completed step."""
        self.boundary.clear()
        for module in self._modules:
            module.zero_grad(set_to_none=True)

    def _tag(self, values: StateValues) -> dict[str, Tensor | bytes]:
        return {(self.prefix + k if isinstance(v, Tensor) else k): v for k, v in values.items()}

    def state(self) -> dict[str, Tensor | bytes]:
        """The checkpoint state now: :class:`StatefulState`'s, every tensor entry named
        ``stages.<stage>.<entry>`` (``stages.1.model.block.ln1.weight``, ``stages.1.optim.state.0.exp_avg``)."""
        return self._tag(super().state())

    def restore_state(self) -> dict[str, Tensor | bytes]:
        """The template a restore fills (optimizers materialized), named as :meth:`state`."""
        return self._tag(super().restore_state())

    def load_state(self, values: StateValues) -> None:
        """Drop an interrupted step's work, then load ``values`` (named as :meth:`state`)."""
        self.abandon_step()
        n = len(self.prefix)
        super().load_state({(k[n:] if k.startswith(self.prefix) else k): v for k, v in values.items()})

    def sparse_operators(self, activations: Mapping[str, int] | None = None):
        """``(list[Operator], {operator: OperatorMembers})`` of this rank's state, members named as
        :meth:`state` (see :class:`~lifeline.runtime.Operators`); ``activations``: tokens routed per
        expert operator."""
        ops, members = self.registry.operators(super().state(), activations)
        tag = self.prefix
        return ops, {n: OperatorMembers(tuple(tag + w for w in m.weights), tuple(tag + o for o in m.optimizer))
                     for n, m in members.items()}

    def expert_activations(self) -> dict[str, int]:
        """Tokens routed to each expert operator since the previous call (the ``counts`` hook)."""
        return self.registry.activations()
