"""Upstream logging and log-fed receives for a ``torch.distributed.pipelining`` stage.

:class:`PipelineBoundary` attaches to a user's ``PipelineStage`` (or a traced ``_PipelineStage``) and
its single-stage schedule (``ScheduleGPipe``, ``Schedule1F1B``) without changing the stage module:
it wraps four of the stage's methods on the instance, the ones every single-stage schedule calls at
the stage's boundary,

* ``get_fwd_send_ops(m)`` / ``get_bwd_send_ops(m)``: every tensor the stage sends downstream (its
  forward outputs of micro-batch ``m``, direction ``"fwd"``) and upstream (the gradients of its
  inputs of micro-batch ``m``, direction ``"bwd"``) is recorded in the rank's upstream log, keyed
  ``(step, micro-batch, stage, direction)`` as the reference trainer keys it;
* ``get_fwd_recv_ops(m)`` / ``get_bwd_recv_ops(m)``: live, unchanged; in a replay they fill the
  receive buffers from the neighbours' logs and return no operation, and the sends return none
  either (what would be sent is logged again, so the stage's own log is whole once more).

Global gradient-norm clipping across stages is a collective a replay cannot run:
:meth:`PipelineBoundary.clip_grad_norm_` gathers the stages' sums of squares live and logs them
(direction ``"norm"``, as the reference trainer does), and reads them from a neighbour's log in a replay.

The schedule itself runs unchanged: the same forward and backward calls, in its own order, with
the same loss, gradient scaling and accumulation order, hence a replay bit-identical to the step
it recomputes (on CPU, deterministic kernels).

One departure from torch's own start-up: a schedule's first ``step()`` normally runs a collective
over the pipeline group (a vote on shape inference, static or dynamic, and a P2P warm-up). A rank
restarted into a running job would run it alone (its neighbours' schedules ran it long ago) and
hang. The boundary therefore requires static shapes (``input_args`` and ``output_args`` given to
``PipelineStage``) and sets the schedule's start-up to the static mode with no collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lifeline.errors import ConfigError, RecoveryError

__all__ = ["PipelineBoundary", "FWD", "BWD", "NORM"]

FWD, BWD, NORM = "fwd", "bwd", "norm"


class PipelineBoundary:
    """The logged boundary of one pipeline stage (see the module docstring).

    Args:
        stage: the rank's ``torch.distributed.pipelining.PipelineStage`` (``stage.stage_index`` is
            this rank's pipeline coordinate), built with ``input_args`` and ``output_args``.
        schedule: its single-stage schedule (``ScheduleGPipe`` or ``Schedule1F1B``, with a
            ``loss_fn``); one stage per rank.

    Raises:
        ConfigError: the stage has no static shapes (``input_args``/``output_args``), a floating-point
            one crossing a boundary without ``requires_grad``, or the schedule does not drive this stage.

    Attributes:
        log: where sent tensors are recorded (``record(iteration, micro_batch, direction, tensor)``:
            the runtime's ``UpstreamLog``), or ``None`` (nothing recorded).
        iteration: the 0-based step being computed (completed optimizer steps before it).
        source: ``None`` live; in a replay the neighbours' logs (``fetch(out, iteration=,
            micro_batch=, stage=, direction=, rank=)``, the runtime's ``UpstreamLog``).
        bytes_sent: bytes of every tensor recorded since construction (a figure for benches).
    """

    def __init__(self, stage: Any, schedule: Any) -> None:
        if getattr(schedule, "_stage", None) is not stage:
            raise ConfigError("the schedule does not drive this stage: pass the PipelineStage the schedule "
                              "was built with (one stage per rank)", field="schedule")
        meta = getattr(stage, "_user_meta", None)
        if meta is not None and not meta.is_complete_for_forward():
            raise ConfigError(f"stage {stage.stage_index}: give PipelineStage input_args and output_args (static "
                              "shapes): shape inference at the first step is a collective a rank restarted into "
                              "a running job would run alone", field="stage", key=str(stage.stage_index))
        if meta is not None:
            _check_grads(stage, meta)
        self.stage, self.schedule = stage, schedule
        self.log: Any = None
        self.iteration = 0
        self.source: Any = None
        self.bytes_sent = 0
        self._live = {name: getattr(stage, name) for name in
                      ("get_fwd_send_ops", "get_bwd_send_ops", "get_fwd_recv_ops", "get_bwd_recv_ops")}
        stage.get_fwd_send_ops = self._send(FWD)
        stage.get_bwd_send_ops = self._send(BWD)
        stage.get_fwd_recv_ops = self._recv(FWD)
        stage.get_bwd_recv_ops = self._recv(BWD)
        schedule._initialize_pipeline_distributed_state = self._static_start

    @property
    def index(self) -> int:
        """This stage's index (the layout's pipeline coordinate of the rank)."""
        return int(self.stage.stage_index)

    def _static_start(self, stages: list, has_backward: bool, initialize_p2p: bool) -> None:
        """The schedule's start-up without its collective: static shapes on every stage."""
        from torch.distributed.pipelining._utils import InferenceMode

        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    def _send(self, direction: str) -> Callable[[int], list]:
        live = self._live[f"get_{direction}_send_ops"]

        def send_ops(chunk: int) -> list:
            ops = live(chunk)
            tensors = [op.tensor for op in ops]
            if tensors and self.log is not None:
                packed = _pack(tensors)
                self.log.record(self.iteration, chunk, direction, packed)
                self.bytes_sent += packed.numel() * packed.element_size()
            return ops if self.source is None else []
        return send_ops

    def _recv(self, direction: str) -> Callable[[int], list]:
        live = self._live[f"get_{direction}_recv_ops"]

        def recv_ops(chunk: int) -> list:
            if self.source is None:
                return live(chunk)
            self._fill(direction, chunk)
            return []
        return recv_ops

    def _fill(self, direction: str, chunk: int) -> None:
        """Allocate the receive buffers of micro-batch ``chunk`` and fill them from the sender's log."""
        stage = self.stage
        if direction == FWD:
            infos = stage.args_recv_info[chunk]
        elif not stage.has_backward or stage.is_last:
            return
        else:
            infos = stage.grad_recv_info[chunk]
        infos = [i for i in infos if not i.is_root_arg and i.tensor_meta is not None]
        if not infos:
            return
        sources = {i.source for i in infos}
        if len(sources) != 1:
            raise ConfigError(f"stage {self.index} receives micro-batch {chunk} from stages {sorted(sources)}: "
                              "localized replay supports a stage fed by one neighbour", field="stage")
        (peer,) = sources
        buffers = [i.allocate_buffer(stage.device) for i in infos]
        out = buffers[0] if len(buffers) == 1 else torch.empty(sum(_nbytes(b) for b in buffers), dtype=torch.uint8)
        self.source.fetch(out, iteration=self.iteration, micro_batch=chunk, stage=int(peer), direction=direction,
                          rank=stage._resolve_peer_global_rank(peer))
        if len(buffers) > 1:
            _unpack(out, buffers)

    def clip_grad_norm_(self, parameters: Iterable[Tensor], max_norm: float, eps: float = 1e-6) -> Tensor:
        """Clip the gradients of ``parameters`` (this stage's) to a global L2 norm of ``max_norm`` over
        every stage, with the global norm logged for replays.

        Live: each stage's gradient sum of squares (float64, parameters in the order given) is
        gathered over the pipeline group (``all_gather``: every stage must call it in its step) and
        recorded as the entry ``(step, 0, stage, "norm")`` (float64 ``(stages,)``). In a replay the
        vector comes from a neighbour's log instead and this stage's own sum must equal its entry
        there (the replay's gradients are the live ones, bit for bit). The gradients are multiplied
        by ``min(1, max_norm / (norm + eps))``.

        Returns:
            The global norm (float64 scalar tensor).

        Raises:
            RecoveryError: in a replay, this stage's recomputed sum of squares differs from the
                logged one (the replay diverged; it is abandoned, never used).
        """
        grads = [p.grad for p in parameters if p.grad is not None]
        local = torch.stack([g.detach().double().pow(2).sum() for g in grads]).sum() if grads \
            else torch.zeros((), dtype=torch.float64)
        stages, me = self.stage.num_stages, self.index
        if self.source is None:
            parts = [torch.empty(1, dtype=torch.float64) for _ in range(stages)]
            dist.all_gather(parts, local.reshape(1), group=self.stage.group)
            sumsq = torch.cat(parts)
            if self.log is not None:
                self.log.record(self.iteration, 0, NORM, sumsq)
        else:
            peer = me + 1 if me == 0 else me - 1
            sumsq = torch.empty(stages, dtype=torch.float64)
            self.source.fetch(sumsq, iteration=self.iteration, micro_batch=0, stage=peer, direction=NORM,
                              rank=self.stage._resolve_peer_global_rank(peer))
            if float(sumsq[me]) != float(local):
                raise RecoveryError(f"replay of step {self.iteration + 1} diverged on stage {me}: gradient sum of "
                                    f"squares {float(local)!r} != logged {float(sumsq[me])!r}",
                                    step=self.iteration + 1)
            if self.log is not None:
                self.log.record(self.iteration, 0, NORM, sumsq)
        norm = sumsq.sum().sqrt()
        coef = min(1.0, max_norm / (float(norm) + eps))
        for g in grads:
            g.mul_(coef)
        return norm

    def clear(self) -> None:
        """Drop what an interrupted step left in the stage: receive buffers, cached activations and
        gradients, the schedule's losses (a step that failed part-way must not poison the next)."""
        stage = self.stage
        for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
            for info in infos:
                info.buffer = None
        stage.clear_runtime_states()
        stage.bwd_cache.clear()
        stage.backward_state.clear()
        losses = getattr(self.schedule, "_internal_losses", None)
        if losses is not None:
            losses.clear()


def _check_grads(stage: Any, meta: Any) -> None:
    """Static metadata must say that the floating-point tensors crossing a boundary carry gradients
    (else torch's stage sends ``None`` gradients upstream and its neighbour fails far from the cause)."""
    boundary = [] if stage.is_first else [("input_args", m) for m in meta.inputs]
    boundary += [] if stage.is_last else [("output_args", m) for m in meta.outputs]
    for name, m in boundary:
        if m is not None and m.dtype.is_floating_point and not m.requires_grad:
            raise ConfigError(f"stage {stage.stage_index}: give PipelineStage {name} floating-point tensors "
                              "with requires_grad=True (static metadata says which tensors carry gradients "
                              "across stages)", field="stage", key=str(stage.stage_index))


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _pack(tensors: list[Tensor]) -> Tensor:
    """One log entry for the tensors of one micro-batch and direction: the tensor itself when one,
    else their bytes concatenated in send order (uint8)."""
    if len(tensors) == 1:
        return tensors[0].detach().contiguous()
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _unpack(packed: Tensor, buffers: list[Tensor]) -> None:
    offset = 0
    for b in buffers:
        n = _nbytes(b)
        b.view(-1).view(torch.uint8).copy_(packed[offset: offset + n])
        offset += n
