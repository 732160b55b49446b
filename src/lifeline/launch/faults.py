"""What an ``--inject-failure`` does when it fires (kinds in :mod:`lifeline.launch.inject`).

:class:`Faults` acts on a running :class:`~lifeline.launch.supervisor.Supervisor`'s pods, nodes,
services and catalog, and keeps one :class:`FiredFault` per injection (the summary's ``faults``):
when it fired, at which step, which copies a ``flip`` corrupted and which nodes it took down. Service
faults only kill the server; :mod:`lifeline.launch._watch` brings it back (MinIO after the outage).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lifeline.checkpoint import ShardMetadata, list_steps, read_manifest
from lifeline.errors import CatalogError, LifelineError
from lifeline.launch import _flip
from lifeline.launch.inject import Injection

__all__ = ["FiredFault", "Faults", "SETTLE_SECONDS", "L2_WAIT_SECONDS", "held_copies", "recovers"]

SETTLE_SECONDS = 1.5
CATALOG_WAIT_SECONDS = 15.0
"""A flip waits at most this long for the catalog to answer with the rank's sidecar registered (a
``redis`` fault of the same step restarts Redis empty, and the sidecars file their copies again)."""
"""A ``flip`` waits at most this long, after killing, for the rank's last save to be sealed and filed."""
L2_WAIT_SECONDS = 30.0
"""A ``flip`` at L2 waits at most this long for a first checkpoint to be committed to L2 (the rounds
pause meanwhile; training goes on)."""


@dataclass
class FiredFault:
    """One injection that fired.

    Attributes:
        injection: what was injected.
        at: when, seconds since the epoch.
        step: the highest step any rank had reported then.
        recovers: whether it calls for a recovery (a process or node fault; service faults do not).
        copies: for ``flip``: each corrupted copy ``{"step", "rank", "tier", "holder", "where"}``.
        nodes: nodes it marked lost.
        note: what went differently (e.g. no copy to flip was found).
        ineffective: it fired after every trainer had finished, and did nothing.
        moot: a ``flip`` found nothing to corrupt because the catalog records no copy of the rank at its
            tier (earlier faults took them and none was made since): its kill still counts, its
            corruption check does not. A flip that misses a copy the catalog records is not moot.
    """

    injection: Injection
    at: float
    step: int
    recovers: bool
    copies: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    note: str = ""
    ineffective: bool = False
    moot: bool = False

    def to_dict(self) -> dict[str, Any]:
        inj = self.injection
        return {"fault": str(inj), "kind": inj.kind, "rank": inj.rank, "tier": inj.tier, "when": inj.when,
                "at": round(self.at, 4), "step": self.step, "recovers": self.recovers, "copies": self.copies,
                "nodes": self.nodes, "note": self.note, "ineffective": self.ineffective, "moot": self.moot}


def recovers(inj: Injection) -> bool:
    """Whether ``inj`` calls for a recovery: a process or node fault, and a transient ``nan`` (the step's
    re-run is clean: a faulty rank, which fails after the step and is restarted, docs/numerics.md);
    not the service kinds, a ``slow`` rank or a ``nan`` that repeats (its batch is skipped)."""
    if inj.kind == "nan":
        return inj.transient
    return inj.kind not in ("redis", "minio", "slow")


def held_copies(holdings: Any, rank: int, tier: str, alive: set[int]) -> list[Any]:
    """The catalog's ``holdings`` (``Holding``: ``rank``, ``tier``, ``holder``) that are copies of
    ``rank``'s shard at ``tier`` a flip could corrupt: held by the rank's own sidecar for L0, by another
    rank's for L1 — in either case a sidecar in ``alive`` (a copy in the memory of a sidecar that just
    died is gone while the catalog still records it: seed 3220) — and any for L2."""
    return [h for h in holdings if h.rank == rank and h.tier == tier
            and (tier == "L2" or ((h.holder == rank) == (tier == "L0") and h.holder in alive))]


class Faults:
    """Fires injections into a running supervisor (``sup``: its ``pods``, ``nodes``, ``services``,
    ``catalog``, ``name``, ``layout`` and ``tally`` are used; see the module docstring)."""

    def __init__(self, sup: Any) -> None:
        self.sup = sup
        self.fired: list[FiredFault] = []
        self.minio_down_until: float | None = None
        """While set, the watchdog leaves MinIO down until this time (a ``minio`` outage)."""

    def fire(self, inj: Injection, *, step: int | None = None) -> FiredFault:
        """Inject ``inj`` now; returns (and keeps) its record. Never raises for a rank without a pod
        or a copy not found: the record's ``note`` says so. ``step``: a step a rank is known to have
        reported although this round's catalog view may not show it yet (the step a trainer holds at)."""
        sup = self.sup
        rec = FiredFault(inj, time.time(), max([*sup.tally.seen_step.values(), step or 0]),
                         recovers=recovers(inj))
        if sup.pods and all(p.exit_code("trainer") == 0 for p in sup.pods.values()):
            rec.recovers, rec.ineffective, rec.note = False, True, "the job had finished: nothing injected"
            self.fired.append(rec)
            return rec
        try:
            getattr(self, f"_{inj.kind}")(inj, rec)
        except (LifelineError, OSError) as err:
            rec.note = f"{type(err).__name__}: {err}"[:300]
        self.fired.append(rec)
        return rec

    # ------------------------------------------------------------------ ranks
    def _kill(self, inj: Injection, rec: FiredFault, rank: int | None = None, *, node: bool = False) -> None:
        rank = inj.rank if rank is None else rank
        pod = self.sup.pods.get(rank)
        if pod is None:
            rec.note = f"rank {rank} has no pod"
            return
        for role in (("trainer", "sidecar") if node else inj.kills):
            pod.kill(role)
        if node:
            self.sup.returns.lose(pod.node)  # lost (and back after --node-return-seconds, when set)
            rec.nodes.append(pod.node)

    def _trainer(self, inj: Injection, rec: FiredFault) -> None:
        self._kill(inj, rec)

    def _sidecar(self, inj: Injection, rec: FiredFault) -> None:
        self._kill(inj, rec)

    def _node(self, inj: Injection, rec: FiredFault) -> None:
        self._kill(inj, rec, node=True)

    def _preempt(self, inj: Injection, rec: FiredFault) -> None:
        """SIGTERM the trainer, wait for it to exit (its checkpoint in L1) at most the grace, then take the
        node: SIGKILL what is left, mark it lost (:func:`lifeline.launch._preempt.preempt_pod`)."""
        from lifeline.launch._preempt import preempt_pod

        pod = self.sup.pods.get(inj.rank)
        if pod is None:
            rec.note = f"rank {inj.rank} has no pod"
            return
        rec.note = preempt_pod(pod, inj.grace_seconds)
        self._kill(inj, rec, node=True)

    def _hang(self, inj: Injection, rec: FiredFault) -> None:
        pod = self.sup.pods.get(inj.rank)
        if pod is not None:
            pod.hang()

    def _nan(self, inj: Injection, rec: FiredFault) -> None:
        """Nothing to do: the rank's trainer poisoned its batch itself (``LIFELINE_FAULT_NAN``, given at its
        start); this record fires once the rank reported the step."""
        rec.note = "the trainer poisoned its batch itself (LIFELINE_FAULT_NAN)"

    def _slow(self, inj: Injection, rec: FiredFault) -> None:
        """Nothing to do: the rank's trainer sleeps before each step itself (``LIFELINE_FAULT_SLOW``, given at
        its start); this record fires once the rank reported the step."""
        rec.note = f"the trainer slows itself {inj.slow_factor:g}x from this step (LIFELINE_FAULT_SLOW)"

    # ------------------------------------------------------------------ services
    def _redis(self, inj: Injection, rec: FiredFault) -> None:
        self._server("redis").kill()

    def _minio(self, inj: Injection, rec: FiredFault) -> None:
        server = self._server("minio")
        self.minio_down_until = rec.at + inj.outage_seconds
        server.kill()

    def _server(self, name: str) -> Any:
        for server in self.sup.services.servers:
            if server.name == name:
                return server
        raise LifelineError(f"this run started no {name} server to inject a fault into"
                            + ("; use an s3:// L2 URI without --s3-endpoint" if name == "minio" else ""),
                            job=self.sup.name)

    # ------------------------------------------------------------------ flips
    def _flip(self, inj: Injection, rec: FiredFault) -> None:
        if not self._await_catalog(inj.rank):
            rec.note = f"the catalog did not list rank {inj.rank}'s sidecar within {CATALOG_WAIT_SECONDS:g} s; "
        {"L0": self._flip_l0, "L1": self._flip_l1, "L2": self._flip_l2}[inj.tier or "L0"](inj, rec)

    def _await_catalog(self, rank: int, limit: float = CATALOG_WAIT_SECONDS) -> bool:
        """Wait until the catalog answers and lists ``rank``'s sidecar, at most ``limit`` seconds; False
        when it did not. A flip finds the copies to corrupt through the catalog: right after a Redis
        restart (a ``redis`` fault at the same step, fuzz seed 3027) it refused the connection, and the
        flip corrupted nothing. The flip runs in the supervisor's round, so the wait does the round's
        service watch itself (:meth:`~lifeline.launch._watch.ServiceWatch.tick`: Redis restarted, the
        catalog repaired)."""
        deadline = time.monotonic() + limit
        while True:
            try:
                if self.sup.catalog.is_registered(rank):
                    return True
            except CatalogError:  # Redis restarts in the supervisor's rounds, which this flip holds up
                self.sup.watch.tick()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _own_copies(self, rank: int):
        """``(step, meta, slot path, blob)`` of ``rank``'s verified L0 copies in its arena, newest step first
        (a step in two slots: both, by slot name)."""
        sup = self.sup
        pod = sup.pods.get(rank)
        if pod is None:
            return
        for step in sorted(sup.catalog.steps(), reverse=True):
            raw = sup.catalog.meta(step, rank)
            if raw is None:
                continue
            meta = ShardMetadata.from_json(raw)
            for path, blob in _flip.find_slots(pod.spec.arena_dir, meta):
                yield step, meta, path, blob

    def _flip_l0(self, inj: Injection, rec: FiredFault) -> None:
        self._kill(inj, rec)  # first: its restart in place reads L0; the save in flight is sealed meanwhile
        self._settle(inj.rank)
        for step, meta, path, _ in self._own_copies(inj.rank):  # every copy: the plan picks which it reads
            _flip.flip_file(path, _flip.flip_offset(meta))
            rec.copies.append({"step": step, "rank": inj.rank, "tier": "L0", "holder": inj.rank, "where": path.name})
        if not rec.copies:
            rec.note = f"no L0 copy of rank {inj.rank} found in its arena"
            self._moot(inj, rec, "L0")

    def _settle(self, rank: int, quiet: float = 0.2, limit: float = SETTLE_SECONDS) -> None:
        """Wait until the steps with ``rank``'s metadata in the catalog did not change for ``quiet``
        seconds (a save handed over before the kill is sealed and filed), at most ``limit``."""
        cat = self.sup.catalog
        deadline = time.monotonic() + limit
        seen, since = None, time.monotonic()
        while time.monotonic() < deadline:
            now = tuple(s for s in cat.steps()[-4:] if cat.meta(s, rank) is not None)
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.02)

    def _committed(self, found: tuple, limit: float) -> list[int]:
        """The steps of the job committed to L2, waiting up to ``limit`` seconds for a first one (its
        upload may lag the training step that made it due)."""
        deadline = time.monotonic() + limit
        while True:
            steps = list_steps(found[0], found[1], self.sup.name)
            if steps or time.monotonic() > deadline:
                return steps
            time.sleep(0.1)

    def _l1_holders(self, step: int, rank: int) -> list[int]:
        return sorted(h.holder for h in self.sup.catalog.holders(step, rank)
                      if h.tier == "L1" and h.holder is not None and h.holder != rank)

    def _flip_l1(self, inj: Injection, rec: FiredFault) -> None:
        sup = self.sup
        self._kill(inj, rec, node=True)  # first, so that no newer replica lands after the flip; its
        self._settle(inj.rank)           # arena stays until its replacement runs
        for step, meta, _, blob in self._own_copies(inj.rank):
            named = self._l1_holders(step, inj.rank)
            others = [k for k in sorted(sup.pods) if k != inj.rank and k not in named]
            for k in named + others:  # the catalog's holders first; its record may lag the copy
                pod = sup.pods.get(k)
                pid = pod.pids().get("sidecar") if pod is not None else None
                if pid is None:
                    continue
                n = _flip.flip_in_process(pid, blob, _flip.flip_offset(meta))
                if n:
                    rec.copies.append({"step": step, "rank": inj.rank, "tier": "L1", "holder": k,
                                       "where": f"sidecar of rank {k} (pid {pid}), {n} match(es)"})
                    if k in named:
                        break
            if rec.copies:  # the newest replicated step: the one the replacement restores
                break
        if not rec.copies:
            rec.note = f"no L1 copy of rank {inj.rank} found in a peer's memory"
            self._moot(inj, rec, "L1")

    def _moot(self, inj: Injection, rec: FiredFault, tier: str) -> None:
        """Mark a flip that found no copy moot when the catalog records none of the rank at ``tier`` that
        a live sidecar holds (:func:`held_copies`) at any recorded step."""
        cat = self.sup.catalog
        try:
            holdings = cat.holdings_at(cat.steps()[-64:])
        except LifelineError:
            return
        alive = {k for k, pod in self.sup.pods.items() if pod is not None and "sidecar" in pod.pids()}
        if not held_copies(holdings, inj.rank, tier, alive):
            rec.moot = True
            rec.note += "; the catalog records none a live sidecar holds (earlier faults took them): nothing to corrupt"

    def _flip_l2(self, inj: Injection, rec: FiredFault) -> None:
        sup = self.sup
        found = sup.services.storage()
        self._await_minio()
        if found is None or not self._committed(found, L2_WAIT_SECONDS):
            rec.note = "no step committed to L2"
            self._moot(inj, rec, "L2")  # e.g. an outage held a rank's upload until its node went (seed 3074)
            return
        rec.at = time.time()  # the fault starts here (after waiting for a checkpoint to flip)
        # only L2 may hold the shard: the rank's node goes, and so do the nodes of its replicas; first,
        # so that the checkpoint flipped below is the newest one, the one the rollback reads
        newest = sorted(sup.catalog.steps(), reverse=True)[:3]
        holders = sorted({k for s in newest for k in self._l1_holders(s, inj.rank)})
        self._kill(inj, rec, node=True)
        for k in holders:
            self._kill(inj, rec, k, node=True)
        storage, prefix = found
        step = max(self._settled(found))
        manifest = read_manifest(storage, prefix, sup.name, step)
        chunks = [ref.chunk for t in manifest.tensors.values() for ref in t.chunks if ref.rank == inj.rank]
        c = max(chunks, key=lambda c: (c.byte_length, -c.byte_offset))
        key = _flip.flip_stored(storage, prefix, sup.name, step, inj.rank, c.byte_offset + c.byte_length // 2)
        rec.copies.append({"step": step, "rank": inj.rank, "tier": "L2", "holder": None, "where": key})

    def _await_minio(self, limit: float = L2_WAIT_SECONDS) -> None:
        """Wait out a ``minio`` outage this run injected (at most ``limit`` seconds): an L2 flip reads the
        storage, and one fired in the round of the outage found MinIO down (fuzz seed 3077). The flip
        holds up the round whose service watch starts MinIO's restart, so it ticks the watch itself."""
        deadline = time.monotonic() + limit
        while self.minio_down_until is not None and time.monotonic() < deadline:
            self.sup.watch.tick()  # starts the restart (in the background) once the outage is over
            time.sleep(0.05)

    def _settled(self, found: tuple, quiet: float = 2.0, limit: float = 10.0) -> list[int]:
        """The committed steps once they did not change for ``quiet`` seconds (a commit under way when
        the nodes went, by a surviving sidecar, lands first), at most ``limit`` seconds."""
        deadline = time.monotonic() + limit
        seen, since = None, time.monotonic()
        while True:
            steps = list_steps(found[0], found[1], self.sup.name)
            if steps != seen:
                seen, since = steps, time.monotonic()
            if time.monotonic() - since >= quiet or time.monotonic() > deadline:
                return steps
            time.sleep(0.05)
