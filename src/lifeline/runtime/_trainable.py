"""The protocols a trainer implements for :func:`~lifeline.runtime.run_training`: ``Trainable``, its
``StepReport`` and the ``ModelSpec`` that builds it (optional hooks: :mod:`lifeline.runtime._hooks`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from torch import Tensor

from lifeline.checkpoint import Layout

__all__ = ["ModelSpec", "StepReport", "Trainable"]


class StepReport(Protocol):
    """What one ``train_step()`` returns: ``step`` (completed optimizer steps after it), ``loss``
    (float, or ``None`` where the rank computes none), ``tokens`` (the whole job's in the step) and
    ``seconds`` (the step's wall time). Optionally ``wait_seconds``, the part of ``seconds`` spent in the
    step's collectives: the straggler scores then judge the rank (``ReportsWait``, docs/stragglers.md)."""

    @property
    def step(self) -> int: ...

    @property
    def loss(self) -> float | None: ...

    @property
    def tokens(self) -> int: ...

    @property
    def seconds(self) -> float: ...


class Trainable(Protocol):
    """One rank's trainer as :func:`run_training` drives it (e.g. ``GPTMoETrainer``).

    ``step`` is the number of completed optimizer steps; ``connect(timeout)`` builds the
    process-group dependent parts (sub-groups, each bounded by ``timeout``) after every (re)join;
    ``disconnect()`` drops every reference to them before the generation is torn down (a group
    still referenced keeps its gloo sockets open, so peers wait out their collective timeout
    instead of failing at once); ``train_step()`` runs one step and returns a
    :class:`StepReport` (``step``, ``loss``, ``tokens``, ``seconds``); ``state()`` /
    ``load_state()`` are the checkpoint state and its inverse. Optionally ``before_update``, a
    callable attribute the trainer calls after each backward pass and before its optimizer update:
    with it the runtime overlaps a save's memcpy with the next step (``LIFELINE_OVERLAP_SAVE``). The
    optional hooks are the protocols of :mod:`lifeline.runtime._hooks` (``BeforeUpdate``,
    ``LogsUpstream``, ``SparseOperators``, ``ProvidesRestoreState``), checked with ``isinstance``.
    """

    step: int

    def connect(self, timeout: timedelta | None = None) -> None: ...

    def disconnect(self) -> None: ...

    def train_step(self) -> StepReport: ...

    def state(self) -> Mapping[str, Tensor | bytes]: ...

    def load_state(self, values: Mapping[str, Tensor | bytes]) -> None: ...


class ModelSpec(Protocol):
    """Builds the :class:`Trainable` of global ``rank`` in ``layout`` (e.g. ``GPTMoESpec``)."""

    def build(self, layout: Layout, rank: int) -> Trainable: ...
