"""One step's micro-batches on one pipeline stage, run in the order of a schedule.

:class:`PipelineStep` walks the ops of :func:`~lifeline.models.gpt_moe._pipeline_schedules.schedule_ops`
(GPipe or 1F1B): a :class:`~lifeline.models.gpt_moe._pipeline_schedules.Compute` runs one micro-batch's
forward or backward pass, an :class:`~lifeline.models.gpt_moe._pipeline_schedules.Exchange` moves tensors
across the stage's boundaries. Live, an exchange of one transfer is a blocking gloo ``send`` or
``recv``; one of two posts ``irecv`` and ``isend`` and then waits on both (so the two neighbours
of a steady-state 1F1B round never wait on each other). In a replay every receive reads the
neighbour's upstream log instead and nothing is sent. Every tensor sent (or, in a replay, that
would be sent) is recorded in the stage's log keyed by (iteration, micro-batch, direction), never
by buffer slot, so the log is the same whatever the schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lifeline.models.gpt_moe._config import GPTMoEConfig
from lifeline.models.gpt_moe._pipeline_schedules import BWD, FWD, Compute, Exchange, Op, Transfer

__all__ = ["PipelineStep", "StepTotals"]

Record = Callable[[int, int, str, Tensor], None]


@dataclass(frozen=True)
class StepTotals:
    """What the micro-batches of one step add up to on a stage: ``lm_total`` the sum of the
    micro-batches' cross entropies (float32 scalar tensor; 0 except on the last stage),
    ``aux_total`` the sum of the stage's load-balancing losses (a float), ``in_flight`` the most
    micro-batches whose activations the stage held at once."""

    lm_total: Tensor
    aux_total: float
    in_flight: int


class PipelineStep:
    """The micro-batches of a step on stage ``stage`` (ranks ``prev``/``next`` its neighbours, ``None``
    at the ends), in the order of ``ops``.

    Args:
        model: the stage (``GPTMoEStage``): ``model(x) -> (out, aux)``, ``model.loss(logits, targets)``.
        cfg: the model configuration (``micro_batch``, ``seq_len``, ``d_model``, ``aux_loss_coef``).
        ops: the stage's schedule.
        stage, prev, next: this stage and its neighbours' global ranks.
        record: ``record(iteration, micro_batch, direction, tensor)``, called for every tensor sent.
    """

    def __init__(self, model: Any, cfg: GPTMoEConfig, ops: list[Op], stage: int, prev: int | None,
                 next: int | None, record: Record) -> None:
        self.model, self.cfg, self.ops = model, cfg, ops
        self.stage, self.prev, self.next, self.record = stage, prev, next, record
        self.clear()

    def run(self, iteration: int, inputs: Tensor, targets: Tensor, source: Any = None) -> StepTotals:
        """Run every op of the schedule for step ``iteration`` (0-based) and return the totals.

        ``inputs``/``targets``: int64 ``(micro_batches, micro_batch, seq_len)`` token ids (used on
        the first and the last stage). ``source``: a ``ReplaySource`` to read received tensors from
        (a replay), or ``None`` (live gloo point-to-point on the default process group).
        Gradients accumulate into the parameters' ``.grad``; the backward of the last stage's loss
        and of each stage's balancing loss are scaled by ``1 / micro_batches``.
        """
        self._it, self._source = iteration, source
        self._inputs, self._targets = inputs, targets
        self.clear()
        self._lm_total = torch.zeros(())
        self._aux_total = 0.0
        self.wait_seconds = 0.0  # in live sends and receives this step (the straggler scores read it)
        peak = 0
        for op in self.ops:
            if isinstance(op, Compute):
                (self._forward if op.kind == FWD else self._backward)(op.micro_batch)
                peak = max(peak, len(self._saved))
            else:
                self._exchange(op)
        return StepTotals(self._lm_total, self._aux_total, peak)

    wait_seconds: float = 0.0
    """Seconds the last :meth:`run` spent in live sends and receives (waiting for the neighbours included)."""

    def clear(self) -> None:
        """Drop what an interrupted step left (saved activations and their graphs, tensors in transit)."""
        self._inbox: dict[tuple[str, int], Tensor] = {}
        self._outbox: dict[tuple[str, int], Tensor] = {}
        self._saved: dict[int, tuple[Tensor | None, Tensor, Tensor]] = {}

    def _forward(self, m: int) -> None:
        cfg = self.cfg
        if self.prev is None:
            x = self._inputs[m]
        else:
            x = self._inbox.pop((FWD, m)).requires_grad_(True)
        out, aux = self.model(x)
        self._aux_total += float(aux.detach())
        if self.next is None:
            lm = self.model.loss(out, self._targets[m])
            self._lm_total += lm.detach()
            out = (lm + cfg.aux_loss_coef * aux) / cfg.micro_batches
        else:
            self._outbox[(FWD, m)] = out.detach().contiguous()
        self._saved[m] = (x if self.prev is not None else None, out, aux)

    def _backward(self, m: int) -> None:
        cfg = self.cfg
        x, out, aux = self._saved.pop(m)
        if self.next is None:
            out.backward()
        else:
            grad = self._inbox.pop((BWD, m))
            aux_scaled = aux * (cfg.aux_loss_coef / cfg.micro_batches)
            if aux_scaled.requires_grad:
                torch.autograd.backward([out, aux_scaled], [grad, torch.ones(())])
            else:
                out.backward(grad)
        if x is not None:
            self._outbox[(BWD, m)] = x.grad.contiguous()

    def _exchange(self, op: Exchange) -> None:
        cfg, live = self.cfg, self._source is None
        tensors: list[Tensor] = []
        for t in op.transfers:
            if t.send:
                tensors.append(self._outbox.pop((t.direction, t.micro_batch)))
            else:
                tensors.append(torch.empty(cfg.micro_batch, cfg.seq_len, cfg.d_model))
        began = time.perf_counter()
        if live and len(tensors) == 1:
            t, tensor = op.transfers[0], tensors[0]
            (dist.send if t.send else dist.recv)(tensor, self._peer(t))
        elif live:  # receives posted first, then sends; every one awaited before the next op
            works = [dist.irecv(x, self._peer(t)) for t, x in zip(op.transfers, tensors) if not t.send]
            works += [dist.isend(x, self._peer(t)) for t, x in zip(op.transfers, tensors) if t.send]
            for work in works:
                work.wait()
        self.wait_seconds += time.perf_counter() - began
        for t, tensor in zip(op.transfers, tensors):
            if t.send:
                self.record(self._it, t.micro_batch, t.direction, tensor)
                continue
            if not live:
                self._source.fetch(tensor, iteration=self._it, micro_batch=t.micro_batch,
                                   stage=self.stage + t.peer, direction=t.direction, rank=self._peer(t))
            self._inbox[(t.direction, t.micro_batch)] = tensor

    def _peer(self, t: Transfer) -> int:
        peer = self.next if t.peer > 0 else self.prev
        assert peer is not None, "schedule_ops leaves out transfers to a missing neighbour"
        return peer
