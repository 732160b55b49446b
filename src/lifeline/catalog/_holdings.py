"""The holdings half of :class:`~lifeline.catalog.Catalog`: which verified copies of which shard exist.

Two records of one memory copy, kept together by every write here:

* ``holders:<step>:<rank>`` - the set the planner reads (``L0@<h>``, ``L1@<h>``, ``L2``);
* ``held:<h>`` - the reverse index of holder ``h``: a sorted set of ``<step>:<rank>:<tier>`` scored by
  step. Forgetting what one sidecar held (its pod died: :data:`~lifeline.catalog._scripts.PUT_PLAN`,
  :meth:`_Holdings.drop_stale`) reads that index and touches only the copies it names, O(copies held),
  instead of every (step, rank) key of the job (O(steps x world size), about a million commands for a
  lost node of 8 ranks in a 1,000-rank job, in one blocking Lua call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lifeline.api.recovery import Holding, RecoveryPlan, Tier
from lifeline.catalog import _scripts
from lifeline.catalog._keys import Keys, held_entry, holder_member, parse_held_entry, parse_member
from lifeline.errors import CatalogError

__all__ = ["PRUNE_HORIZON_STEPS"]

PRUNE_HORIZON_STEPS = 256
"""The newest steps whose metadata :meth:`_Holdings.prune` never forgets (steps)."""


class _Holdings:
    """Mixed into :class:`~lifeline.catalog.Catalog` (which provides ``_r``, ``_call``, ``keys``,
    ``world_size`` and ``job``)."""

    _r: Any
    _call: Callable[..., Any]
    keys: Keys
    world_size: int
    job: str

    def _register_holding_scripts(self) -> None:
        self._spare = self._r.register_script(_scripts.SPARE)
        self._release = self._r.register_script(_scripts.RELEASE)
        self._prune = self._r.register_script(_scripts.PRUNE)

    def add_holding(self, step: int, rank: int, tier: Tier, holder: int | None = None,
                    meta_json: str | None = None) -> None:
        """Record a verified copy of (step, rank) at ``tier`` held by rank ``holder``'s sidecar
        (``None`` for L2), with the shard's metadata JSON when given."""
        p = self._r.pipeline(transaction=True)
        if meta_json is not None:
            p.set(self.keys.meta(step, rank), meta_json)
            p.sadd(self.keys.filed(step), rank)
        p.sadd(self.keys.holders(step, rank), holder_member(tier, holder))
        if holder is not None:
            p.zadd(self.keys.held(holder), {held_entry(step, rank, tier): step})
        p.zadd(self.keys.steps, {str(step): step})
        self._call(p.execute)

    def remove_holding(self, step: int, rank: int, tier: Tier, holder: int | None = None) -> None:
        """Forget a copy of (step, rank) (evicted or found corrupt)."""
        p = self._r.pipeline(transaction=True)
        p.srem(self.keys.holders(step, rank), holder_member(tier, holder))
        if holder is not None:
            p.zrem(self.keys.held(holder), held_entry(step, rank, tier))
        self._call(p.execute)

    def release_holding(self, step: int, rank: int, tier: Tier, holder: int) -> bool:
        """Forget ``holder``'s memory copy of (step, rank) before its sidecar evicts it, unless the step is
        spared (:meth:`spare`): ``True`` when forgotten (evict it), ``False`` when spared (keep it)."""
        keys = [self.keys.spared, self.keys.holders(step, rank), self.keys.held(holder)]
        args = [step, holder_member(tier, holder), held_entry(step, rank, tier)]
        return bool(self._call(self._release, keys=keys, args=args))

    def spare(self, plan: RecoveryPlan, ttl_seconds: float) -> bool:
        """Keep ``plan.restore_step`` in every sidecar's memory for ``ttl_seconds`` (or until
        :meth:`unspare`), atomically with the check that each memory copy the plan names
        (``plan.sources`` at L0/L1) is still recorded. ``False`` (nothing set) when one was evicted since
        the plan was made: plan again from the current holdings. Used before publishing a plan the
        trainers read while they go on saving (an elastic grow), so its step outlives the ``keep`` newest.

        Raises:
            CatalogError: the plan has no restore step, or Redis unreachable.
        """
        if plan.restore_step is None:
            raise CatalogError("a plan without a restore step has nothing to spare", job=self.job)
        args: list[object] = [plan.restore_step, max(1, int(ttl_seconds * 1000))]
        for src in plan.sources:
            if src.tier != "L2":
                args += [self.keys.holders(plan.restore_step, src.rank), holder_member(src.tier, src.holder)]
        return bool(self._call(self._spare, keys=[self.keys.spared], args=args))

    def unspare(self) -> None:
        """Let the sidecars evict the spared step again (its plan's restore is done)."""
        self._call(self._r.delete, self.keys.spared)

    def spared_step(self) -> int | None:
        """The step spared in memory (:meth:`spare`), or ``None``."""
        raw = self._call(self._r.get, self.keys.spared)
        return int(raw) if raw is not None else None

    def held_by(self, holder: int) -> list[tuple[int, int, Tier]]:
        """The memory copies recorded for ``holder``'s sidecar, ``(step, rank, tier)`` by step (its
        reverse index ``held:<holder>``)."""
        raw = self._call(self._r.zrange, self.keys.held(holder), 0, -1)
        return [e for e in (parse_held_entry(x) for x in raw) if e is not None]

    def drop_stale(self, holder: int, held: Iterable[tuple[int, int, Tier]]) -> int:
        """Forget the memory holdings (``L0``/``L1``) recorded for ``holder``'s sidecar that it does not
        hold (``held``: its ``(step, rank, tier)``): left by an earlier incarnation of that sidecar (a
        lost pod, a restarted process) whose memory died with it. Reads the holder's reverse index, so
        the cost is the copies recorded for it, not the job's steps x ranks. Returns how many were dropped."""
        keep = set(held)
        drop = [e for e in self.held_by(holder) if e not in keep]
        if not drop:
            return 0
        p = self._r.pipeline(transaction=True)
        for s, r, t in drop:
            p.srem(self.keys.holders(s, r), holder_member(t, holder))
            p.zrem(self.keys.held(holder), held_entry(s, r, t))
        return int(sum(self._call(p.execute)[::2]))

    def holders(self, step: int, rank: int) -> frozenset[Holding]:
        """The recorded copies of (step, rank)."""
        return self._holdings_from({(step, rank): self._call(self._r.smembers, self.keys.holders(step, rank))})

    def holder_names(self, step: int, rank: int) -> frozenset[str]:
        """The recorded copies of (step, rank) in their stored form (``L0@<r>``, ``L1@<r>``, ``L2``),
        for inspection and logs."""
        return frozenset(holder_member(h.tier, h.holder) for h in self.holders(step, rank))

    def holdings_at(self, steps: Iterable[int]) -> frozenset[Holding]:
        """Every recorded copy of every rank's shard at ``steps`` (one pipelined round trip)."""
        pairs = [(s, r) for s in steps for r in range(self.world_size)]
        if not pairs:
            return frozenset()
        p = self._r.pipeline(transaction=False)
        for s, r in pairs:
            p.smembers(self.keys.holders(s, r))
        return self._holdings_from(dict(zip(pairs, self._call(p.execute))))

    def _holdings_from(self, members: dict[tuple[int, int], Iterable[str]]) -> frozenset[Holding]:
        out = set()
        for (step, rank), found in members.items():
            for m in found:
                parsed = parse_member(m)
                if parsed is not None and (parsed[1] is None or parsed[1] < self.world_size):
                    out.add(Holding(step, rank, *parsed))
        return frozenset(out)

    def meta(self, step: int, rank: int) -> str | None:
        """The ``ShardMetadata`` JSON of (step, rank), or ``None`` when unknown."""
        return self._call(self._r.get, self.keys.meta(step, rank))

    def metas(self, step: int, world_size: int | None = None) -> list[str | None]:
        """The metadata JSON of every rank at step (``None`` where unknown); ``world_size`` ranks of the
        layout the step was saved in (default: the catalog's, which an elastic reshard changes)."""
        n = self.world_size if world_size is None else world_size
        return self._call(self._r.mget, [self.keys.meta(step, r) for r in range(n)])

    def steps(self) -> list[int]:
        """Every step with any recorded holding, ascending."""
        return [int(s) for s in self._call(self._r.zrange, self.keys.steps, 0, -1)]

    def prune(self, *, horizon: int = PRUNE_HORIZON_STEPS, batch: int = 64) -> int:
        """Forget steps that no copy is left of (every memory copy released, none in L2) and that are
        more than ``horizon`` steps older than the newest: their metadata, filed set and ``steps``
        entry. Without it the catalog grows by one metadata document per rank per checkpoint forever
        (at ``checkpoint.every: 1`` and 1,000 ranks, a thousand keys a step). The ``horizon`` newest
        steps keep their metadata whatever they hold: verified replay compares a replayed state with
        the checksums of the steps after the one restored. Examines at most ``batch`` steps per call,
        oldest first, each once (a cursor in ``pruned``); a step examined while still held (an L2
        checkpoint) stays. One Lua call, O(batch x ranks). Returns how many steps were forgotten.

        Raises:
            CatalogError: Redis unreachable.
        """
        args = [int(horizon), self.keys.prefix, int(batch)]
        return int(self._call(self._prune, keys=[self.keys.steps, self.keys.pruned], args=args) or 0)
