"""Optional hooks of a trainer or a checkpointer, declared as runtime-checkable protocols.

The runtime asks ``isinstance(obj, Protocol)`` instead of probing attribute names: a trainer or a
checkpointer of one's own opts into a behaviour by providing the members of its protocol (no base
class needed). ``isinstance`` on a ``@runtime_checkable`` protocol checks that the members exist,
not their signatures: the signatures below are the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from lifeline.checkpoint import Layout

__all__ = ["BeforeUpdate", "LogsUpstream", "ProvidesRestoreState", "ProvidesInitialState", "Relayouts", "OverlapsSave", "SidecarBacked",
           "SparseOperators", "ReportsReshard", "KnowsDurability", "ChecksNumerics"]


@runtime_checkable
class BeforeUpdate(Protocol):
    """A trainer that calls ``before_update()`` (when not ``None``) after each backward pass and before
    its optimizer update writes the state: with it (and an :class:`OverlapsSave` checkpointer) the runtime
    overlaps a save's memcpy with the next step (``LIFELINE_OVERLAP_SAVE``)."""

    before_update: Callable[[], None] | None


@runtime_checkable
class LogsUpstream(Protocol):
    """A pipeline-stage trainer that records what it sends across a stage boundary in ``log`` (set by the
    runtime to its :class:`~lifeline.runtime._replay.UpstreamLog`, or ``None``) and can re-run a step
    from its neighbours' logs (``replay_step(source)``, localized replay)."""

    log: object | None

    def replay_step(self, source: object) -> object: ...


@runtime_checkable
class SparseOperators(Protocol):
    """A Mixture-of-Experts trainer that names its operators for sparse checkpoints: ``sparse_operators()``
    is ``(the window's operators, {operator: its state entries})`` and ``expert_activations()`` the tokens
    routed to each expert since the last call (``{operator: count}``)."""

    def sparse_operators(self, activations: Mapping[str, int] | None = None) -> tuple[object, Mapping[str, object]]: ...

    def expert_activations(self) -> Mapping[str, int]: ...


@runtime_checkable
class ProvidesRestoreState(Protocol):
    """A trainer whose restore template differs from its save state: ``restore_state()`` returns a state
    with every saved name, shape and dtype (e.g. optimizer moments materialized before the first step),
    which the checkpointer fills in place and ``load_state`` then takes."""

    def restore_state(self) -> Mapping[str, object]: ...


@runtime_checkable
class ProvidesInitialState(Protocol):
    """A trainer that keeps its own initial state (step 0): ``initial_state()``, loaded when a plan restarts
    the job from scratch. Without it the runtime builds a fresh trainer of the model spec for that state."""

    def initial_state(self) -> Mapping[str, object]: ...


@runtime_checkable
class Relayouts(Protocol):
    """A checkpointer that can switch layouts in place (an elastic reshard): ``relayout(layout, world_size)``."""

    def relayout(self, layout: Layout, world_size: int) -> None: ...


@runtime_checkable
class OverlapsSave(Protocol):
    """A checkpointer whose save can overlap the next step: ``save_overlapped(step, state, generation=g)``
    starts the copy, ``settle()`` finishes it and returns its receipt (``None`` when nothing was in flight)."""

    def save_overlapped(self, step: int, state: Mapping[str, object], *, generation: int = 0) -> object: ...

    def settle(self) -> object | None: ...


@runtime_checkable
class SidecarBacked(Protocol):
    """A checkpointer that talks to the pod's sidecar (``client``: the connected ``SidecarClient``);
    upstream logs and sparse windows live in that sidecar."""

    client: object


@runtime_checkable
class ReportsReshard(Protocol):
    """A checkpointer that says where a resharding restore read its bytes (``last_reshard``: a report
    with ``fields()``, or ``None`` after a restore in the saved layout)."""

    last_reshard: object | None


@runtime_checkable
class KnowsDurability(Protocol):
    """A checkpointer that can tell whether checkpoint ``step`` is committed to L2."""

    def committed_to_l2(self, step: int) -> bool: ...


@runtime_checkable
class ChecksNumerics(Protocol):
    """A trainer whose steps the runtime checks for NaN and loss spikes before their update
    (:mod:`lifeline.runtime._numerics`, docs/numerics.md). It calls ``before_update()`` (when not ``None``)
    once per step, after its gradients are final and before the optimizer update, on every rank;
    ``step_numerics()`` answers there with the step's ``(loss, grad_norm)``: Python floats, the loss
    (nats/token) as the step will report it (``None`` on a rank that computes none) and the global
    gradient L2 norm (``None`` when unknown); ``abandon_step()`` drops the work of a step that
    ``before_update`` stopped by raising (the state stays that of the last completed step; the same batch
    is read again by the next ``train_step``); ``skip_batch()`` advances the step counter and the data
    position by one without an update (the batch is skipped; a failure-free run with that step skipped
    does the same)."""

    before_update: Callable[[], None] | None

    def step_numerics(self) -> tuple[float | None, float | None]: ...

    def abandon_step(self) -> None: ...

    def skip_batch(self) -> None: ...
