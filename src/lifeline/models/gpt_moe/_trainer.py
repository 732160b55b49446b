"""The GPT-MoE trainer of one rank: pipeline schedule (GPipe or 1F1B), data-parallel all-reduce, AdamW."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from lifeline.checkpoint import Expert, Layout, PatternRules, Replicated
from lifeline.errors import ConfigError, RecoveryError
from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._data import StdlibLoader, stdlib_corpus
from lifeline.models.gpt_moe._groups import Groups, build_groups
from lifeline.models.gpt_moe._operators import expert_operator, stage_operators
from lifeline.models.gpt_moe._parallel import ParallelContext
from lifeline.models.gpt_moe._patterns import pattern_rules
from lifeline.models.gpt_moe._pipeline import PipelineStep
from lifeline.models.gpt_moe._precision import torch_dtype
from lifeline.models.gpt_moe._lr_schedule import apply_clip, clip_coefficient, local_sumsq, lr_at
from lifeline.models.gpt_moe._pipeline_schedules import schedule_ops
from lifeline.models.gpt_moe._stage import GPTMoEStage
from lifeline.models.gpt_moe._state import load_state, state
from lifeline.models.gpt_moe._zero import Zero1AdamW

__all__ = ["GPTMoETrainer", "StepResult", "StageLog", "ReplaySource", "deterministic_cpu"]


class StageLog(Protocol):
    """Where a stage records what it sends across a pipeline boundary (the runtime's upstream log).

    ``direction``: ``"fwd"`` activations sent to stage + 1 (float32 ``(micro_batch, seq_len,
    d_model)``), ``"bwd"`` gradients sent to stage - 1 (same shape), ``"norm"`` the world's
    gradient sums of squares of the step (float64 ``(world_size,)``, ``micro_batch`` 0).
    ``iteration`` is the 0-based step being computed (completed steps before it).
    """

    def record(self, iteration: int, micro_batch: int, direction: str, tensor: Tensor) -> None: ...


class ReplaySource(Protocol):
    """The neighbours' upstream logs a replaying stage reads: fills ``out`` (its shape and dtype
    are the entry's) with the entry ``(iteration, micro_batch, stage, direction)`` that ``rank``
    logged. Raises :class:`~lifeline.errors.RecoveryError` when the entry is gone."""

    def fetch(self, out: Tensor, *, iteration: int, micro_batch: int, stage: int, direction: str,
              rank: int) -> None: ...


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: ``step`` completed steps after it, ``loss`` the language-model cross
    entropy (nats/token, mean over data-parallel replica groups; ``None`` except on the last
    stage), ``aux_loss`` the stage's load-balancing loss (mean over micro-batches), ``tokens`` the
    tokens the whole job trained on in this step, ``seconds`` the step's wall time, ``wait_seconds`` the
    part of it spent in the step's collectives (gradient all-reduce, clipping's all-gather, pipeline
    sends and receives: waiting for slower ranks included; the straggler scores, docs/stragglers.md)."""

    step: int
    loss: float | None
    aux_loss: float
    tokens: int
    seconds: float
    wait_seconds: float = 0.0


def deterministic_cpu(threads: int = 1) -> None:
    """Make CPU training reproducible bit for bit: deterministic algorithms, fixed thread count."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


class GPTMoETrainer:
    """The reference trainer of global ``rank`` in ``layout`` (tensor × pipeline × data × expert).

    * Pipeline: stage ``coords.pipeline`` of ``layout.pipeline`` runs its layers; each step runs
      ``cfg.micro_batches`` micro-batches in the order of ``cfg.schedule``: GPipe (Huang et al.
      2019, §2.2: all forwards, then all backwards) or 1F1B (PipeDream-Flush, Narayanan et al.
      2021, §2.2), sending activations forward and their gradients backward with gloo
      point-to-point on the default process group (:mod:`~lifeline.models.gpt_moe._pipeline_schedules`,
      :mod:`~lifeline.models.gpt_moe._pipeline`). Both accumulate gradients in micro-batch
      order: a run is bit-identical under either schedule.
    * Tensor parallel (Megatron-LM, Shoeybi et al. 2019, §3): the stage's attention, shared expert
      and vocabulary are split across the ``T`` ranks of the tensor group (see
      :class:`~lifeline.models.gpt_moe.GPTMoEStage`); activations between stages are whole on
      every tensor rank, so rank ``(t, p, d, e)`` exchanges them with ``(t, p±1, d, e)``.
    * Expert parallel: the ``E`` ranks of an expert group each read their own tokens (replica
      ``d*E + e`` of ``D*E``) and own ``n_experts / E`` experts; tokens travel to their expert and
      back with ``all_to_all_single`` (:mod:`~lifeline.models.gpt_moe._dispatch`).
    * Data parallel: after the backward pass the gradients of the non-expert parameters (and the
      loss, for reporting) are flattened into one buffer, summed with one ``all_reduce`` over the
      ``D*E`` ranks holding the same shard of the stage, divided by ``D*E``; the experts' gradients
      (already summed over the expert group's tokens by the all-to-all's backward) are summed over
      the ``D`` ranks holding the same experts and divided by ``D*E``. The same order every step,
      hence deterministic. (:mod:`~lifeline.models.gpt_moe._groups` lists the groups.)
    * Global gradient-norm clipping (``cfg.grad_clip``): every rank's gradient sum of squares of
      the shards it counts (tensor-split parameters on expert rank 0, replicated ones on tensor and
      expert rank 0, experts on tensor rank 0: each shard once) is gathered (``all_gather`` over
      the world) and the entries of data rank 0 are summed in rank order, so every rank computes
      the same coefficient; then AdamW (``foreach=False``) at :func:`lr_at` of the step (warm-up
      then cosine). The step count is the data loader's position.

    * ZeRO-1 (``cfg.zero1``, Rajbhandari et al. 2020, §5.1): AdamW keeps and updates this data
      rank's partition of every parameter's moments only, then the parameters are all-gathered over
      the ``D`` ranks differing in the data coordinate (:class:`~lifeline.models.gpt_moe._zero.Zero1AdamW`);
      bit-identical to ``zero1=False``.

    Call :meth:`connect` after every (re)initialisation of the default process group (it builds
    the data-parallel groups, a collective every rank must join); single-process runs
    (world size 1) need no process group at all.
    """

    def __init__(self, cfg: GPTMoEConfig, layout: Layout, rank: int) -> None:
        cfg.validate(layout)
        self.cfg, self.layout, self.rank = cfg, layout, rank
        self.coords = layout.coords(rank)
        self.rules: PatternRules = pattern_rules(cfg)
        self.par = ParallelContext(layout.tensor, self.coords.tensor, layout.expert, self.coords.expert)
        self.model = GPTMoEStage(cfg, self.coords.pipeline, layout.pipeline, self.par)
        self.params = list(self.model.parameters())
        named = list(self.model.named_parameters())
        patterns = [self.rules.match(fqn) for fqn, _ in named]
        self._experts = [p for (_, p), pat in zip(named, patterns) if isinstance(pat, Expert)]
        self._dense = [p for (_, p), pat in zip(named, patterns) if not isinstance(pat, Expert)]
        t0, e0 = self.coords.tensor == 0, self.coords.expert == 0
        self._counted = [p for (_, p), pat in zip(named, patterns)
                         if (t0 if isinstance(pat, Expert) else (t0 and e0) if isinstance(pat, Replicated) else e0)]
        adamw = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
        self.zero: Zero1AdamW | None = Zero1AdamW(named, layout, self.coords, **adamw) if cfg.zero1 else None
        self.optimizer = self.zero.optimizer if self.zero is not None else \
            torch.optim.AdamW(self.params, foreach=False, **adamw)
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.loader = StdlibLoader(stdlib_corpus(cfg.corpus_bytes), cfg.seq_len,
                                   cfg.micro_batch * cfg.micro_batches, self.coords.data * layout.expert
                                   + self.coords.expert, layout.data * layout.expert, cfg.seed)
        self.rng = torch.Generator().manual_seed(cfg.seed + 7919 * (rank + 1))
        stage = self.coords.pipeline
        self.prev = layout.rank(dataclasses.replace(self.coords, pipeline=stage - 1)) if stage > 0 else None
        self.next = layout.rank(dataclasses.replace(self.coords, pipeline=stage + 1)) \
            if stage < layout.pipeline - 1 else None
        self.pipeline = PipelineStep(self.model, cfg, schedule_ops(cfg.schedule, layout.pipeline, stage,
                                                                  cfg.micro_batches),
                                     stage, self.prev, self.next, self._record)
        self.activations_in_flight = 0
        """Most micro-batches whose activations this stage held at once in the last step
        (``min(stages - stage, micro_batches)`` under 1F1B, ``micro_batches`` under GPipe)."""
        self.groups = Groups()
        self._distributed = False
        self.log: StageLog | None = None
        self.before_update: Callable[[], None] | None = None
        """Called once per step after the backward pass and before the optimizer update writes the
        state: the runtime joins an overlapped checkpoint copy there (CheckFreq, FAST'21 §4.2)."""
        self._contributors = [r for r in range(layout.world_size) if layout.coords(r).data == 0]
        self._numerics: tuple[float | None, float | None] = (None, None)
        self._clip_local = 0.0

    @property
    def step(self) -> int:
        """Completed optimizer steps (equal to the data loader's position)."""
        return self.loader.position

    @property
    def dp_group(self):
        """The group the non-expert gradients are averaged over (``D*E`` ranks; ``None`` for one)."""
        return self.groups.dense

    def connect(self, timeout: timedelta | None = None) -> None:
        """Build this generation's groups (:func:`~lifeline.models.gpt_moe._groups.build_groups`:
        tensor, expert, data-parallel) on the (new) default process group.

        Every rank of the world must call it, in the same order (``dist.new_group`` is collective).
        ``timeout`` bounds each collective of those groups (torch's default, 30 min, when ``None``;
        the runtime passes its collective timeout so a hung peer is detected in time).
        """
        self.disconnect()
        self._distributed = dist.is_available() and dist.is_initialized()
        if not self._distributed:
            if self.layout.world_size != 1:
                raise ConfigError(f"layout {self.layout.to_dict()} has {self.layout.world_size} ranks: initialise "
                                  "torch.distributed (lifeline.runtime.init) before connect()", field="layout")
            return
        self.groups = build_groups(self.layout, self.coords, timeout)
        self.par.tensor_group, self.par.expert_group = self.groups.tensor, self.groups.expert
        if self.zero is not None:  # the ranks differing only in the data coordinate
            self.zero.group = self.groups.expert_data if self.layout.expert > 1 else self.groups.dense

    def disconnect(self) -> None:
        """Drop this generation's groups (tensor, expert, data-parallel) so their gloo sockets close
        with the process group.

        A group still referenced keeps its sockets open after the default group is destroyed, and
        the peers of this rank then wait out their whole collective timeout instead of seeing the
        connection close (measured: 30 s vs 0.4 s with two gloo processes).
        """
        self.groups = Groups()
        self.par.tensor_group = self.par.expert_group = None
        if self.zero is not None:
            self.zero.group = None
        self._distributed = False

    def train_step(self) -> StepResult:
        """Run one optimizer step on the next batch; returns its :class:`StepResult`.

        With :attr:`log` set, every tensor sent across a pipeline boundary and the step's gradient
        sums of squares are recorded there (upstream logging, MoEvement §5).

        Raises whatever ``torch.distributed`` raises when a peer fails (``RuntimeError`` /
        ``DistBackendError``): the runtime's recovery loop handles it.
        """
        return self._step(None)

    def replay_step(self, source: ReplaySource) -> StepResult:
        """Recompute the next step from the neighbours' upstream logs instead of the pipeline.

        The stage's inputs (activations of stage - 1) and output gradients (from stage + 1) and
        the world's gradient sums of squares of that step come from ``source``; the data-parallel
        all-reduce still runs over the stage's replica group (its replicas replay with it). The
        result is bit-identical to the step the failed rank ran: the same inputs through the same
        deterministic kernels in the same order (the ops of the configured schedule, GPipe or
        1F1B, with every receive read from the log), and the same clipping coefficient. What the stage
        sends is logged again (so its own log is whole once more); nothing is sent.

        Raises:
            RecoveryError: the recomputed sum of squares of this rank differs from the logged one
                (the replay diverged: it is abandoned, never used).
        """
        return self._step(source)

    def abandon_step(self) -> None:
        """Drop the partial work of an interrupted step (gradients zeroed); the state stays that of
        the last completed step. A survivor of a localized recovery calls it instead of restoring."""
        self.pipeline.clear()
        self._zero_grad()

    def step_numerics(self) -> tuple[float | None, float | None]:
        """The step in progress's ``(loss, grad_norm)`` from its ``before_update`` on: the loss as the
        step reports it (nats/token; ``None`` off the last stage) and the global gradient L2 norm before
        clipping (the contributors' sums of squares, as the clipping reads them). The runtime's numerics
        check reads them (:class:`~lifeline.runtime._hooks.ChecksNumerics`)."""
        return self._numerics

    def skip_batch(self) -> None:
        """Skip the next step's batch: the partial work of a stopped step is dropped (:meth:`abandon_step`)
        and the data position, hence :attr:`step`, advances by one without an optimizer update."""
        self.abandon_step()
        self.loader.position += 1

    def expert_counts(self) -> dict[int, Tensor]:
        """Routing assignments of the last step per MoE layer of this stage: global layer index →
        int64 ``(n_experts,)`` (this rank's tokens, forward passes of every micro-batch). The
        activation counts MoEvement's schedule orders experts by (§4.2)."""
        return {int(i): block.moe.routed.clone() for i, block in self.model.layers.items()}

    def expert_activations(self) -> dict[str, int]:
        """Tokens routed to each expert operator of this stage in the last step (this rank's tokens)."""
        return {expert_operator(layer, e): int(n) for layer, c in self.expert_counts().items()
                for e, n in enumerate(c.tolist())}

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the forward and backward passes use the parameters in (``cfg.compute_dtype``):
        sparse checkpoints store FROZEN operators' weights in it (exact: the pass rounds them so)."""
        return torch_dtype(self.cfg.compute_dtype)

    def sparse_operators(self, activations: Mapping[str, int] | None = None):
        """The stage's MoEvement operators and each one's state entries (see
        :func:`~lifeline.models.gpt_moe._operators.stage_operators`): ``(list[Operator],
        dict[name, OperatorMembers])``; ``activations`` are the experts' routed tokens."""
        return stage_operators(dict(self.model.named_parameters()), activations)

    def _step(self, source: ReplaySource | None) -> StepResult:
        cfg = self.cfg
        start = time.perf_counter()
        for block in self.model.layers.values():
            block.moe.reset_routed()
        it = self.loader.position
        batch = self.loader.batch_at(it).view(cfg.micro_batches, cfg.micro_batch, cfg.seq_len + 1)
        inputs, targets = batch[..., :-1], batch[..., 1:]
        m_count = cfg.micro_batches
        totals = self.pipeline.run(it, inputs, targets, source)
        self.activations_in_flight = totals.in_flight
        lm_total, aux_total = totals.lm_total, totals.aux_total
        began = time.perf_counter()  # the collectives below: a slow rank waits least in them
        loss = self._reduce_gradients(lm_total / m_count)
        self._clip(it, source)
        waited = time.perf_counter() - began - self._clip_local + self.pipeline.wait_seconds
        self._numerics = (loss if self.next is None else None, self._numerics[1])
        if self.before_update is not None:
            self.before_update()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(cfg, it)
        (self.zero or self.optimizer).step()
        self._zero_grad()
        self.loader.position += 1
        tokens = cfg.tokens_per_step * self.layout.data * self.layout.expert
        return StepResult(self.step, loss if self.next is None else None, aux_total / m_count, tokens,
                          time.perf_counter() - start, waited)

    def _record(self, iteration: int, micro_batch: int, direction: str, tensor: Tensor) -> None:
        if self.log is not None:
            self.log.record(iteration, micro_batch, direction, tensor)

    def _clip(self, iteration: int, source: ReplaySource | None) -> None:
        """Global gradient-norm clipping: every rank's sum of squares gathered (logged for replays)."""
        began = time.perf_counter()
        local = local_sumsq(self._counted)
        self._clip_local = time.perf_counter() - began  # computing, not waiting
        world = self.layout.world_size
        if source is not None:
            sumsq = torch.empty(world, dtype=torch.float64)
            neighbour = self.prev if self.prev is not None else self.next
            source.fetch(sumsq, iteration=iteration, micro_batch=0,
                         stage=self.layout.coords(neighbour).pipeline, direction="norm", rank=neighbour)
            if float(sumsq[self.rank]) != local:
                raise RecoveryError(f"replay of step {iteration + 1} diverged: gradient sum of squares "
                                    f"{local!r} != logged {float(sumsq[self.rank])!r}", rank=self.rank,
                                    step=iteration + 1)
        elif self._distributed:
            parts = [torch.empty(1, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(parts, torch.tensor([local], dtype=torch.float64))
            sumsq = torch.cat(parts)
        else:
            sumsq = torch.tensor([local], dtype=torch.float64)
        if self.log is not None and world > 1:
            self.log.record(iteration, 0, "norm", sumsq)
        self._numerics = (None, math.sqrt(sum(float(sumsq[r]) for r in self._contributors)))
        apply_clip(self.params, clip_coefficient(self.cfg.grad_clip, sumsq, self._contributors))

    def _reduce_gradients(self, loss: Tensor) -> float:
        """Average gradients over the replicas (see the class docstring); returns the mean loss."""
        replicas = self.layout.data * self.layout.expert
        if self.layout.expert == 1:  # one buffer, every parameter in order (as with pipeline x data only)
            return _all_reduce_mean(self.params, loss, self.groups.dense, replicas)
        _all_reduce_mean(self._experts, None, self.groups.expert_data, replicas)
        return _all_reduce_mean(self._dense, loss, self.groups.dense, replicas)

    def state(self) -> dict[str, Tensor | bytes]:
        """This rank's checkpoint state (see :func:`lifeline.models.gpt_moe.state`)."""
        return state(self.model, self.optimizer, self.loader, self.rng, self._opt_params())

    def load_state(self, values: Mapping[str, Tensor | bytes]) -> None:
        """Restore parameters, AdamW state, data position and RNG from a checkpoint state.

        Gradients are zeroed: a step interrupted by a failure may have accumulated part of them.
        """
        load_state(self.model, self.optimizer, self.loader, values, self.rng, self._opt_params())
        self.pipeline.clear()
        self._zero_grad()

    def _opt_params(self) -> dict[str, Tensor] | None:
        """fqn -> the tensor AdamW updates (the ZeRO-1 partition views; ``None``: the parameters)."""
        return self.zero.shards if self.zero is not None else None

    def _zero_grad(self) -> None:
        """Zero every full gradient (with ZeRO-1 the optimizer's gradients are partitions of them)."""
        (self.zero or self.optimizer).zero_grad(set_to_none=False)


def _all_reduce_mean(params: list[torch.nn.Parameter], loss: Tensor | None, group, replicas: int) -> float:
    """Sum the gradients of ``params`` (and ``loss``) over ``group`` (``None``: this rank alone) with
    one flat ``all_reduce``, divide by ``replicas``; returns the loss so averaged (nan without one)."""
    if replicas == 1:
        return float(loss) if loss is not None else float("nan")
    flat = torch.cat([p.grad.reshape(-1) for p in params] + ([loss.reshape(1)] if loss is not None else []))
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat.div_(replicas)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset: offset + n].view_as(p))
        offset += n
    return float(flat[-1]) if loss is not None else float("nan")
