"""Pipeline schedules as data: the ordered ops of one stage's step, for GPipe and 1F1B.

A stage's step is a list of :class:`Compute` ops (the forward or the backward of one micro-batch)
and :class:`Exchange` ops (one or two :class:`Transfer` s with one neighbour, posted together and
awaited together). :mod:`~lifeline.models.gpt_moe._pipeline` runs the list with gloo ``send``/
``recv`` (one transfer) or ``isend``/``irecv`` pairs (two), or, in a replay, with reads of the
neighbours' upstream logs in place of every receive.

* **GPipe** (Huang et al. 2019, §2.2): every micro-batch's forward, then every backward. The
  backwards run in micro-batch order ``0..M-1`` (as ``torch.distributed.pipelining.ScheduleGPipe``
  does), so each parameter's gradient accumulates in the same order as under 1F1B.
* **1F1B** (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", §2.2, the non-interleaved schedule of Megatron-LM's
  ``forward_backward_pipelining_without_interleaving``): stage ``p`` of ``P`` runs
  ``w = min(P - p - 1, M)`` warm-up forwards, then ``M - w`` rounds of one forward and one
  backward, then ``w`` cool-down backwards. It holds at most ``min(P - p, M)`` micro-batches'
  activations at once (GPipe: ``M``); the pipeline bubble is the same, ``(P - 1) / M``.

Why it cannot deadlock on gloo, whose ``send`` returns only once the peer posted the matching
``recv``: in the steady state stage ``p`` sends forward activation ``w+i`` and receives backward
gradient ``i`` in one :class:`Exchange` while stage ``p + 1`` sends gradient ``i`` and receives
activation ``w+i`` in its own (Megatron's ``send_forward_recv_backward`` /
``send_backward_recv_forward`` pairs): each side posts both transfers before waiting on either, so
neither waits for the other to finish first. Every other transfer is alone in its exchange and
meets a peer blocked on exactly its complement. Transfers on one channel (activations ``p -> p+1``,
gradients ``p+1 -> p``) are posted in micro-batch order on both sides, as gloo matches them (by
source, first in first out). ``tests/models/test_gpt_moe_schedules.py`` model-checks every
schedule up to 8 stages and 12 micro-batches under these rendezvous semantics; the multi-process
tests run them on gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from lifeline.errors import ConfigError

__all__ = ["FWD", "BWD", "Transfer", "Compute", "Exchange", "Op", "schedule_ops", "peak_in_flight"]

FWD = "fwd"
"""Activations, sent by stage ``p`` to stage ``p + 1`` (and the forward pass)."""
BWD = "bwd"
"""Gradients of those activations, sent by stage ``p + 1`` back to stage ``p`` (and the backward pass)."""


@dataclass(frozen=True)
class Transfer:
    """One tensor crossing a stage boundary: the ``direction`` (:data:`FWD` or :data:`BWD`) of
    ``micro_batch``'s tensor, which this stage sends (``send``) or receives."""

    direction: str
    send: bool
    micro_batch: int

    @property
    def peer(self) -> int:
        """The neighbour's stage offset: ``+1`` for a sent activation or a received gradient, else ``-1``."""
        return 1 if (self.direction == FWD) == self.send else -1


@dataclass(frozen=True)
class Compute:
    """The forward (``kind`` :data:`FWD`) or backward (:data:`BWD`) pass of ``micro_batch``."""

    kind: str
    micro_batch: int


@dataclass(frozen=True)
class Exchange:
    """Transfers with one neighbour, all posted before any is awaited (one or two of them)."""

    transfers: tuple[Transfer, ...]


Op = Union[Compute, Exchange]


def schedule_ops(schedule: str, stages: int, stage: int, micro_batches: int) -> list[Op]:
    """The ops of ``stage`` (0-based) of ``stages`` in one step of ``micro_batches`` micro-batches.

    Transfers with a neighbour the stage lacks (before the first stage, after the last) are left
    out, and so is an exchange left empty. The backwards run in micro-batch order under both
    schedules (see the module docstring).

    Raises:
        ConfigError: ``schedule`` is not ``"gpipe"`` or ``"1f1b"`` (``field="schedule"``), or the
            sizes are out of range.
    """
    if stages < 1 or not 0 <= stage < stages or micro_batches < 1:
        raise ConfigError(f"stage {stage} of {stages} stages with {micro_batches} micro-batches is out of range",
                          field="micro_batches")
    first, last = stage == 0, stage == stages - 1
    ops: list[Op] = []

    def exchange(*transfers: Transfer) -> None:
        kept = tuple(t for t in transfers if not (first and t.peer < 0) and not (last and t.peer > 0))
        if kept:
            ops.append(Exchange(kept))

    def recv(direction: str, m: int) -> Transfer:
        return Transfer(direction, False, m)

    def send(direction: str, m: int) -> Transfer:
        return Transfer(direction, True, m)

    def forward(m: int) -> None:
        exchange(recv(FWD, m))
        ops.append(Compute(FWD, m))
        exchange(send(FWD, m))

    def backward(m: int) -> None:
        exchange(recv(BWD, m))
        ops.append(Compute(BWD, m))
        exchange(send(BWD, m))

    if schedule == "gpipe":
        for m in range(micro_batches):
            forward(m)
        for m in range(micro_batches):
            backward(m)
        return ops
    if schedule != "1f1b":
        raise ConfigError(f"schedule={schedule!r} must be 'gpipe' or '1f1b'", field="schedule")
    warmup = min(stages - stage - 1, micro_batches)
    steady = micro_batches - warmup
    for m in range(warmup):
        forward(m)
    if steady:
        exchange(recv(FWD, warmup))
    for i in range(steady):
        ops.append(Compute(FWD, warmup + i))
        exchange(send(FWD, warmup + i), recv(BWD, i))
        ops.append(Compute(BWD, i))
        if i == steady - 1:
            exchange(send(BWD, i))
        else:
            exchange(send(BWD, i), recv(FWD, warmup + i + 1))
    for m in range(steady, micro_batches):
        backward(m)
    return ops


def peak_in_flight(ops: list[Op]) -> int:
    """Most micro-batches whose forward ran and whose backward did not yet, at any point of ``ops``:
    the activations the stage holds at its peak (``min(stages - stage, M)`` for 1F1B, ``M`` for GPipe)."""
    live = peak = 0
    for op in ops:
        if isinstance(op, Compute):
            live += 1 if op.kind == FWD else -1
            peak = max(peak, live)
    return peak
