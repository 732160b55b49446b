"""The recovery plan and the values it is made of: one typed document, one casing (camelCase on the wire).

``lifeline.control`` makes a :class:`RecoveryPlan` from classified :class:`Failure` values and the
job's :class:`Holding` set; the operator records it in the TrainingJob's annotations, both runners
publish it in the catalog (``lifeline.catalog``) and every trainer reads it back from there
(``lifeline.runtime``). :meth:`RecoveryPlan.to_json` / :meth:`RecoveryPlan.from_json` are the only
serialisation, so the annotation, the catalog document and the runtime's view cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from lifeline.api.trainingjob import LayoutSpec, RecoveryAction
from lifeline.errors import ConfigError, RecoveryError

__all__ = [
    "Tier",
    "TIERS",
    "FailureKind",
    "Failure",
    "Holding",
    "RestoreSource",
    "PodPlacement",
    "RecoveryPlan",
]

Tier = Literal["L0", "L1", "L2"]
TIERS: tuple[Tier, ...] = ("L0", "L1", "L2")
"""The tiers, nearest first: L0 the rank's own sidecar memory, L1 a peer sidecar's, L2 object storage."""


class FailureKind(StrEnum):
    """What failed, most severe first (the order ``lifeline.control.classify`` keeps per rank)."""

    NODE_LOST = "NODE_LOST"  # node not Ready, unreachable, or every sidecar on it silent: pods and memory gone
    POD_LOST = "POD_LOST"  # the pod was deleted, evicted or failed: its sidecar memory (L0) is gone
    SIDECAR_LOST = "SIDECAR_LOST"  # the sidecar container died or stopped heartbeating: L0 is gone
    TRAINER_CRASH = "TRAINER_CRASH"  # the trainer container exited non-zero; the sidecar still holds L0
    HANG = "HANG"  # no step progress within recovery.hangTimeoutSeconds
    COLLECTIVE_ERROR = "COLLECTIVE_ERROR"  # a collective failed inside a trainer

    @property
    def loses_memory(self) -> bool:
        """True when the rank's sidecar memory (its L0 copies and the L1 copies it held) is gone."""
        return self in (FailureKind.NODE_LOST, FailureKind.POD_LOST, FailureKind.SIDECAR_LOST)


@dataclass(frozen=True)
class Failure:
    """One classified failure.

    Attributes:
        kind: what failed.
        ranks: the global ranks affected, ascending (all ranks for ``HANG``).
        node: the node involved, if known.
        detail: human-readable evidence (exit code, reason, heartbeat age).
    """

    kind: FailureKind
    ranks: tuple[int, ...]
    node: str | None = None
    detail: str = ""

    def describe(self) -> str:
        """One line, e.g. ``TRAINER_CRASH ranks [3] on node-b: exit 1 (Error)``."""
        where = f" on {self.node}" if self.node else ""
        return f"{self.kind.value} ranks {list(self.ranks)}{where}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Holding:
    """A verified copy of one rank's shard of the checkpoint at ``step``, at ``tier``.

    ``holder`` is the rank whose sidecar holds it: the rank itself for L0, the peer for L1,
    ``None`` for L2 (object storage).

    Raises:
        ConfigError: an unknown tier, an L2 holding with a holder, or a memory holding without one.
    """

    step: int
    rank: int
    tier: Tier
    holder: int | None = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ConfigError(f"holding tier must be one of {TIERS}, got {self.tier!r}", field="tier")
        if self.tier == "L2" and self.holder is not None:
            raise ConfigError("an L2 holding has no holder rank", field="holder")
        if self.tier != "L2" and self.holder is None:
            raise ConfigError(f"an {self.tier} holding needs the holder rank", field="holder")

    @staticmethod
    def complete(step: int, world_size: int, tier: Tier = "L2") -> frozenset[Holding]:
        """Every rank's shard at ``step`` in ``tier`` (L0: each rank holds its own)."""
        return frozenset(Holding(step, r, tier, None if tier == "L2" else r) for r in range(world_size))


@dataclass(frozen=True)
class RestoreSource:
    """Where the shard of ``rank`` (a rank of the layout the checkpoint was saved in) is read from.

    ``holder`` is the rank whose sidecar serves it (L0: ``rank`` itself, L1: the peer; ``None``
    for L2) and ``node`` that sidecar's node (``None`` for L2).
    """

    rank: int
    tier: Tier
    holder: int | None
    node: str | None


@dataclass(frozen=True)
class PodPlacement:
    """A pod to create for ``rank`` on ``node`` (``None``: no node has room now; the scheduler
    places it when one does, avoiding the plan's cool-down nodes)."""

    rank: int
    node: str | None


@dataclass(frozen=True)
class RecoveryPlan:
    """What to do about a failure, for generation ``generation``.

    Attributes:
        action: the ladder rung.
        generation: the new process-group generation (the previous one + 1).
        restarts: the new value of ``status.restarts``.
        restore_step: the step the restoring ranks load (``None``: start from the initial state,
            and for ``GiveUp``).
        layout: the layout of the new generation (smaller after ``Reshard``).
        node_of_rank: node of each rank of the new generation (``None``: not yet placed).
        restore_ranks: ranks of the new generation that load ``restore_step`` (the others keep
            their in-memory state: only under ``LocalizedReplay``).
        sources: per shard of the saved layout, where to read it, ascending by rank.
        restart_ranks: trainer containers to restart in their (kept) pods.
        create_pods: pods to create, ascending by rank.
        delete_ranks: pods to delete: ranks beyond a smaller world size.
        cool_downs: ``(node, expiry seconds since epoch)`` for the job's new pods to avoid.
        failures: the failures this plan answers.
        reason: why this rung, in words (for events and ``status.recoveries[].reason``).
        replay_to_step: ``LocalizedReplay`` only: the step the replaying stage catches up to.
        restore_window: W (steps) when ``restore_step`` names the start of a complete sparse window
            of W slots (MoEvement §4) that the restoring ranks load slot by slot; ``None`` when it
            names a dense checkpoint. A restore reads exactly the copy the plan names: a window is
            never taken for a dense copy of the same step, nor the other way round.
    """

    action: RecoveryAction
    generation: int
    restarts: int
    restore_step: int | None
    layout: LayoutSpec
    node_of_rank: tuple[str | None, ...]
    restore_ranks: tuple[int, ...]
    sources: tuple[RestoreSource, ...]
    restart_ranks: tuple[int, ...]
    create_pods: tuple[PodPlacement, ...]
    delete_ranks: tuple[int, ...]
    cool_downs: tuple[tuple[str, float], ...]
    failures: tuple[Failure, ...]
    reason: str
    replay_to_step: int | None = None
    restore_window: int | None = None

    @classmethod
    def restore_all(cls, generation: int, restore_step: int | None, layout: LayoutSpec, *,
                    action: RecoveryAction = RecoveryAction.ROLLBACK, saved: LayoutSpec | None = None,
                    restarts: int = 0, reason: str = "") -> RecoveryPlan:
        """A plan in which every rank of ``layout`` (re)starts and loads ``restore_step`` from L2
        (``None``: the initial state): a run resumed from storage, or a reshard.

        Args:
            saved: the layout the checkpoint was saved in (default ``layout``); one L2 source per
                rank of it.
        """
        world = layout.world_size
        saved_world = (saved or layout).world_size if restore_step is not None else 0
        return cls(
            action=action, generation=generation, restarts=restarts, restore_step=restore_step, layout=layout,
            node_of_rank=(None,) * world, restore_ranks=tuple(range(world)),
            sources=tuple(RestoreSource(r, "L2", None, None) for r in range(saved_world)),
            restart_ranks=(), create_pods=tuple(PodPlacement(r, None) for r in range(world)), delete_ranks=(),
            cool_downs=(), failures=(), reason=reason,
        )

    @property
    def avoid_nodes(self) -> frozenset[str]:
        """Nodes the job's new pods must not use (node affinity ``NotIn``)."""
        return frozenset(node for node, _ in self.cool_downs)

    @property
    def farthest_tier(self) -> Tier | None:
        """The farthest tier any source reads from (for ``status.recoveries[].tier``)."""
        return max((s.tier for s in self.sources), key=TIERS.index, default=None)

    @property
    def reads_memory(self) -> bool:
        """The plan restores some shard from sidecar memory (L0 or L1). Until every rank read it, the
        sidecars may still evict that copy (``keep``) as saves of newer steps land, sealed after the
        catalog view the plan was made from (fuzz seed 3085: ``keep`` 1, the step-10 copy a
        ``RestartInPlace`` named was replaced by step 11's); ``lifeline run`` spares the step
        (:meth:`lifeline.catalog.Catalog.spare`) before it publishes such a plan. A sparse window's plan
        (``restore_window``) reads slots of the upstream-log store, not shards: nothing to spare."""
        return self.restore_step is not None and self.restore_window is None and any(
            s.tier != "L2" for s in self.sources)

    @property
    def reads_memory_while_training(self) -> bool:
        """A plan answering no failure (an elastic grow) that reads some shard from sidecar memory: the
        trainers go on saving until they read it, so its step must be spared from eviction
        (:meth:`lifeline.catalog.Catalog.spare`) before it is published."""
        return not self.failures and self.restore_step is not None and any(s.tier != "L2" for s in self.sources)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        """Every rank named by :attr:`failures`, ascending."""
        return tuple(sorted({r for f in self.failures for r in f.ranks}))

    @property
    def memory_lost_ranks(self) -> tuple[int, ...]:
        """Ranks whose sidecar memory died with the failures this plan answers (a lost node, pod or
        sidecar, and every pod the plan replaces), ascending, numbered in the layout the failures
        happened in. Their L0 copies and the L1 copies they held are gone: the catalog forgets them when
        the plan is published (:meth:`lifeline.catalog.Catalog.put_plan`), so a later plan never reads
        them. Empty for a plan that answers no failure (a start, a resume or an elastic grow)."""
        if not self.failures:
            return ()
        lost = {r for f in self.failures if f.kind.loses_memory for r in f.ranks}
        if self.action is not RecoveryAction.RESHARD:  # a reshard numbers its new pods in the new layout
            lost |= {p.rank for p in self.create_pods}
        return tuple(sorted(lost))

    def source_of(self, rank: int) -> RestoreSource:
        """The source of ``rank``'s shard. Raises ``KeyError`` if the plan reads none for it."""
        for source in self.sources:
            if source.rank == rank:
                return source
        raise KeyError(rank)

    def to_wire(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict with camelCase keys (the catalog and annotation document)."""
        return {
            "action": self.action.value,
            "generation": self.generation,
            "restarts": self.restarts,
            "restoreStep": self.restore_step,
            "replayToStep": self.replay_to_step,
            "restoreWindow": self.restore_window,
            "layout": self.layout.to_wire(),
            "nodeOfRank": list(self.node_of_rank),
            "restoreRanks": list(self.restore_ranks),
            "sources": [[s.rank, s.tier, s.holder, s.node] for s in self.sources],
            "restartRanks": list(self.restart_ranks),
            "createPods": [[p.rank, p.node] for p in self.create_pods],
            "deleteRanks": list(self.delete_ranks),
            "coolDowns": [[n, t] for n, t in self.cool_downs],
            "failures": [[f.kind.value, list(f.ranks), f.node, f.detail] for f in self.failures],
            "reason": self.reason,
        }

    def to_json(self) -> str:
        """A JSON text (stable key order) that :meth:`from_json` reads back to an equal plan."""
        return json.dumps(self.to_wire(), sort_keys=True)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RecoveryPlan:
        """Read a plan from :meth:`to_wire`'s dict.

        Raises:
            RecoveryError: a field is missing or malformed (names the field).
        """
        try:
            return cls(
                action=RecoveryAction(d["action"]),
                generation=int(d["generation"]),
                restarts=int(d["restarts"]),
                restore_step=d["restoreStep"],
                replay_to_step=d.get("replayToStep"),
                restore_window=d.get("restoreWindow"),
                layout=LayoutSpec.model_validate(d["layout"]),
                node_of_rank=tuple(d["nodeOfRank"]),
                restore_ranks=tuple(d["restoreRanks"]),
                sources=tuple(RestoreSource(r, t, h, n) for r, t, h, n in d["sources"]),
                restart_ranks=tuple(d["restartRanks"]),
                create_pods=tuple(PodPlacement(r, n) for r, n in d["createPods"]),
                delete_ranks=tuple(d["deleteRanks"]),
                cool_downs=tuple((n, float(t)) for n, t in d["coolDowns"]),
                failures=tuple(Failure(FailureKind(k), tuple(r), n, det) for k, r, n, det in d["failures"]),
                reason=d["reason"],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RecoveryError(f"malformed recovery plan document: {type(err).__name__}: {err}",
                                key=str(err) if isinstance(err, KeyError) else None) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> RecoveryPlan:
        """Read a plan written by :meth:`to_json`.

        Raises:
            RecoveryError: not JSON, or a field is missing or malformed.
        """
        try:
            data = json.loads(text)
        except ValueError as err:
            raise RecoveryError(f"recovery plan document is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise RecoveryError("recovery plan document is not a JSON object")
        return cls.from_wire(data)
