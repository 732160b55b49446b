"""The sidecar's background workers, each given exactly the collaborators it uses: replication (L1),
persistence (L2) and catalog heartbeats."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lifeline.catalog import LogCoverage, SidecarRegistration
from lifeline.checkpoint import ShardMetadata, Storage, blob_key, commit
from lifeline.errors import AuthError, CatalogError, ChecksumError, ManifestError, PeerError, StorageError
from lifeline.sidecar import _format
from lifeline.sidecar._link import CatalogLink
from lifeline.sidecar._memory import Memory
from lifeline.sidecar._peers import Peers
from lifeline.sidecar.metrics import SidecarMetrics
from lifeline.sidecar.peer import PeerClient
from lifeline.sidecar.store import Holding

__all__ = ["Watermarks", "PersistDue", "Replicator", "Persister", "Heartbeat"]

log = logging.getLogger("lifeline.sidecar.workers")


@dataclass
class Watermarks:
    """This rank's newest step sealed (L0), replicated to every target (L1) and persisted (L2); -1: none."""

    sealed: int = -1
    replicated: int = -1
    persisted: int = -1


class PersistDue:
    """The newest checkpoint due for L2 (an older one waiting is superseded and unpinned).

    Each holding offered carries one pin for persistence, owned by exactly one party at a time: this
    object while it waits here, the persister from :meth:`take` until it hands it back
    (:meth:`retry`) or drops it (``memory.unpin``). A pin unpinned twice would leave the holding
    with a negative count, which the store never evicts (seed 5098: a MinIO outage during a save,
    then the trainer waited for an arena slot until the job was declared hung).
    """

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.cv = threading.Condition()
        self.holding: Holding | None = None

    def offer(self, h: Holding) -> None:
        """Make ``h`` (pinned by the caller for persistence) the one due."""
        with self.cv:
            old, self.holding = self.holding, h
            self.cv.notify_all()
        if old is not None:
            self.memory.unpin(old)  # superseded before the persister took it

    def take(self, stopping: threading.Event) -> Holding | None:
        """The holding due, now the caller's (with its pin); waits for one, ``None`` once ``stopping``."""
        with self.cv:
            while self.holding is None and not stopping.is_set():
                self.cv.wait(1.0)
            h, self.holding = self.holding, None
            return h

    def retry(self, h: Holding) -> bool:
        """Hand back ``h`` after a failed attempt: due again unless a newer one was offered meanwhile
        (then ``h`` is superseded and unpinned). ``True`` when it is due again."""
        with self.cv:
            if self.holding is None:
                self.holding = h
                return True
        self.memory.unpin(h)
        return False

    def wake(self) -> None:
        with self.cv:
            self.cv.notify_all()


@dataclass(frozen=True)
class CoverageMark:
    """Queued behind the upstream-log entries of steps ``<= last``: when the replicator reaches it, each
    of them was sent to every peer or failed, and the coverage ``first..last`` (steps) is recorded in
    the catalog from past the newest step with an entry that failed. A plan thus relies only on
    replicated log coverage (issue 22): the trainer's sidecar may die the moment after a step, and its
    slots and logs are then read from the peers."""

    rank: int
    first: int
    last: int
    kind: str = "mark"


class Replicator:
    """Streams each sealed checkpoint (and upstream-log entry) to this rank's placement targets.

    Only the newest queued checkpoint is sent when several wait (older ones are superseded). A
    target that fails is retried once on a fresh connection, then skipped for that step. Upstream-log
    coverage is recorded when a :class:`CoverageMark` is reached (in queue order).
    """

    def __init__(self, items: queue.Queue, memory: Memory, peers: Peers, link: CatalogLink, metrics: SidecarMetrics,
                 marks: Watermarks, stopping: threading.Event, on_change: Callable[[], None]) -> None:
        self.items, self.memory, self.peers, self.link = items, memory, peers, link
        self.metrics, self.marks, self.stopping, self.on_change = metrics, marks, stopping, on_change
        self.hole = 0
        """The newest step with an upstream-log entry not sent to every peer (0: none)."""

    def run(self) -> None:
        conns: dict[int, PeerClient] = {}
        while True:
            h = self.items.get()
            if h is None:
                break
            newer = []
            while True:  # drain: keep only the newest shard, every upstream-log entry
                try:
                    nxt = self.items.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.items.put(None)
                    break
                newer.append(nxt)
            batch = [h, *newer]
            try:
                self._batch(batch, conns)
            finally:  # the queue's unfinished tasks count what is not replicated yet (a draining sidecar waits)
                for _ in batch:
                    self.items.task_done()
        for c in conns.values():
            c.close()

    def _batch(self, batch: list, conns: dict[int, PeerClient]) -> None:
        """Replicate every upstream-log entry (and coverage mark) of ``batch`` and its newest shard."""
        shards = [x for x in batch if x.kind == "shard"]
        for old in shards[:-1]:
            self.memory.unpin(old)
        for item in [x for x in batch if x.kind != "shard"] + shards[-1:]:
            if isinstance(item, CoverageMark):
                self._cover(item)
                continue
            try:
                if not self._one(item, conns) and item.kind == "ulog":
                    self.hole = max(self.hole, item.step + 1)  # iteration i is step i + 1
            finally:
                self.memory.unpin(item)

    def _cover(self, mark: CoverageMark) -> None:
        first = max(mark.first, self.hole + 1)
        if first <= mark.last:
            self.link.call(self.link.catalog.record_log_coverage, LogCoverage(mark.rank, first, mark.last))  # replicated

    def _one(self, h: Holding, conns: dict[int, PeerClient]) -> bool:
        """Send ``h`` to every target; ``True`` when each acknowledged it."""
        while not self.stopping.is_set():
            try:
                targets = self.peers.targets()
                break
            except (PeerError, CatalogError) as err:
                log.debug("replication of step %d waits: %s", h.step, err)
                if h.evicted or self.stopping.wait(0.2):
                    return False
        else:
            return False
        ok = 0
        for t in targets:
            for attempt in (1, 2):
                try:
                    c = conns.get(t)
                    if c is None:
                        c = conns[t] = self.peers.connect(t)
                    t0 = time.perf_counter()
                    c.put(kind=h.kind, name=h.name, step=h.step, rank=h.rank, blob=h.buf[: h.nbytes], meta=h.meta)
                    self.metrics.replicated_bytes.inc(h.nbytes)
                    log.info("replicated %s step %d to rank %d", h.kind, h.step, t, extra={
                        "event": "replicated", "step": h.step, "target": t, "nbytes": h.nbytes,
                        "seconds": time.perf_counter() - t0})
                    ok += 1
                    break
                except (PeerError, ChecksumError, CatalogError, OSError) as err:
                    bad = conns.pop(t, None)
                    if bad is not None:
                        bad.close()
                    if not isinstance(err, AuthError):  # auth refusals were counted by the connection's hook
                        self.metrics.errors.labels("checksum" if isinstance(err, ChecksumError) else "peer").inc()
                    log.warning("replicating %s step %d to rank %d failed (attempt %d): %s", h.kind, h.step, t,
                                attempt, err)
        if h.kind == "shard" and ok == len(targets):
            self.marks.replicated = max(self.marks.replicated, h.step)
            if self.link.required_tier == "L1":
                self.link.advance(h.step)
        self.on_change()
        return ok == len(targets)


class Persister:
    """Persists the newest due checkpoint to L2 straight from memory; retries until it lands.

    Blob first (the storage client retries transient errors); the rank completing the set writes the
    manifest (the commit marker) last. While storage is down, L0/L1 go on and the newest due step
    waits here; older due steps are superseded. Never blocks the trainer.

    Args:
        put: writes one blob (the S3 uploader's parallel parts straight from the arena, or ``storage.put``).
    """

    def __init__(self, due: PersistDue, storage: Storage, prefix: str, put: Callable[[str, memoryview], None], *,
                 job: str, memory: Memory, link: CatalogLink, metrics: SidecarMetrics,
                 marks: Watermarks, stopping: threading.Event) -> None:
        self.due, self.storage, self.prefix, self.put = due, storage, prefix, put
        self.job = job
        self.memory, self.link, self.metrics, self.marks, self.stopping = memory, link, metrics, marks, stopping

    def run(self) -> None:
        backoff = 0.5
        while not self.stopping.is_set():
            h = self.due.take(self.stopping)
            if h is None:
                return
            try:
                self._one(h)
            except (StorageError, CatalogError, ManifestError, OSError) as err:
                self.metrics.errors.labels("storage" if not isinstance(err, CatalogError) else "catalog").inc()
                log.warning("persisting step %d failed; retrying in %.1f s: %s", h.step, backoff, err)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                self.due.retry(h)  # or superseded meanwhile: unpinned
                continue
            backoff = 0.5
            self.memory.unpin(h)

    def _one(self, h: Holding) -> None:
        t0 = time.perf_counter()
        try:  # a copy corrupted in memory since it was sealed must not become a committed L2 checkpoint
            _format.verify(h.meta, h.buf[: h.nbytes], rank=h.rank, step=h.step, tier="L0")
        except ChecksumError as err:
            self.link.report_corrupt(err, "L0", f"local@{self.link.rank} before persisting")
            self.memory.store.remove(h)  # forgotten in the catalog too; this step is not persisted
            return
        self.put(blob_key(self.prefix, self.job, h.step, h.rank), h.buf[: h.nbytes])
        self.metrics.persisted_bytes.inc(h.nbytes)
        log.info("persisted step %d rank %d", h.step, h.rank, extra={
            "event": "persisted", "step": h.step, "nbytes": h.nbytes, "seconds": time.perf_counter() - t0})
        catalog = self.link.catalog
        world = ShardMetadata.from_json(h.meta).layout.world_size  # the step's own (a reshard changes it)
        if catalog.mark_persisted(h.step, h.rank, world):
            metas = catalog.metas(h.step, world)
            missing = [r for r, m in enumerate(metas) if m is None]
            if missing:
                raise CatalogError(f"metadata of ranks {missing} missing for step {h.step}", job=self.job, step=h.step)
            shards = [ShardMetadata.from_json(m) for m in metas if m is not None]
            commit(self.storage, self.prefix, self.job, h.step, shards[0].layout, shards)  # checks blobs; manifest last
            for r in range(world):
                catalog.add_holding(h.step, r, "L2")
            log.info("committed step %d to L2 (manifest written last)", h.step)
            if self.link.required_tier == "L2":
                self.link.advance(h.step)
        self.marks.persisted = max(self.marks.persisted, h.step)
        self.metrics.persistence_lag.set(max(0, self.marks.sealed - self.marks.persisted))


class Heartbeat:
    """Refreshes the registration every ``period`` seconds (TTL: three periods; rank 0's also prunes the
    catalog's steps no copy is left of, :meth:`~lifeline.catalog.Catalog.prune`); after a Redis restart
    or outage re-registers every holding and re-tries advancing each held step. Follows the job's
    generation: when a new generation's plan has another layout (an elastic reshard kept this pod),
    the catalog's world size becomes the plan's, which placement and completeness then use."""

    def __init__(self, link: CatalogLink, memory: Memory, registration: Callable[[], SidecarRegistration], *,
                 period: float, metrics: SidecarMetrics, stopping: threading.Event,
                 on_change: Callable[[], None]) -> None:
        self.link, self.memory, self.registration, self.period = link, memory, registration, period
        self.metrics, self.stopping, self.on_change = metrics, stopping, on_change
        self._generation = -1

    def _follow_generation(self) -> None:
        catalog = self.link.catalog
        generation = catalog.generation()
        if generation == self._generation:
            return
        plan = catalog.plan(generation) if generation > 0 else None
        if plan is not None and plan.layout.world_size != catalog.world_size:
            log.info("generation %d has world size %d (was %d): following it", generation, plan.layout.world_size,
                     catalog.world_size)
            catalog.world_size = plan.layout.world_size
        self._generation = generation

    def run(self) -> None:
        catalog = self.link.catalog
        while True:
            try:
                reg = self.registration()
                was = catalog.is_registered(reg.rank)
                catalog.register(reg, ttl_seconds=3 * self.period)
                if self.link.dirty or not was:
                    self._resync(reg.rank)
                    self.link.dirty = False
                self._follow_generation()
                if reg.rank == 0:  # one sidecar keeps the catalog bounded (Catalog.prune)
                    catalog.prune()
                latest = catalog.latest_complete_step()
                if latest is not None:
                    self.link.seen_complete(latest)
            except CatalogError as err:
                if not self.link.dirty:
                    log.warning("catalog unreachable: %s", err)
                self.link.dirty = True
                self.metrics.errors.labels("catalog").inc()
            self.on_change()
            if self.stopping.wait(self.period):
                return

    def _resync(self, rank: int) -> None:
        catalog = self.link.catalog
        steps = set()
        items = [h for h in self.memory.store.items() if h.kind == "shard"]
        for h in items:
            catalog.add_holding(h.step, h.rank, h.tier, rank, h.meta)  # type: ignore[arg-type]
            steps.add(h.step)
        # what an earlier incarnation of this rank's sidecar recorded died with it (a lost node)
        stale = catalog.drop_stale(rank, [(h.step, h.rank, h.tier) for h in items])
        for h in self.memory.store.items():  # a copy filed meanwhile was just dropped too: file it again
            if h.kind == "shard" and h not in items:
                catalog.add_holding(h.step, h.rank, h.tier, rank, h.meta)  # type: ignore[arg-type]
        # every held step in one call: after a Redis restart the step is set once every rank has
        # re-filed and spoken, never from one rank's stale view (Catalog.try_advance)
        latest = catalog.try_advance(steps, self.link.required_tier, rank=rank, floor=self.link.store.latest_complete)
        self.link.seen_complete(latest)
        log.info("catalog (re)registered %d holdings, dropped %d stale ones", len(items), stale)
