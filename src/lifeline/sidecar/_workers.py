"""The sidecar's background workers: replication (L1), persistence (L2) and catalog heartbeats."""

from __future__ import annotations

import logging
import os
import queue
import time

from lifeline.catalog import SidecarRegistration
from lifeline.errors import CatalogError, ChecksumError, ManifestError, PeerError, StorageError

log = logging.getLogger("lifeline.sidecar.workers")


def replicator(sc) -> None:
    """Stream each sealed checkpoint (and upstream-log entry) to this rank's placement targets.

    Only the newest queued checkpoint is sent when several wait (older ones are superseded).
    A target that fails is retried once on a fresh connection, then skipped for that step.
    """
    conns: dict[int, object] = {}
    while True:
        h = sc.repl_q.get()
        if h is None:
            break
        newer = []
        while True:  # drain: keep only the newest shard, every upstream-log entry
            try:
                nxt = sc.repl_q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                sc.repl_q.put(None)
                break
            newer.append(nxt)
        batch = [h, *newer]
        shards = [x for x in batch if x.kind == "shard"]
        for old in shards[:-1]:
            sc.unpin(old)
        todo = [x for x in batch if x.kind != "shard"] + shards[-1:]
        for item in todo:
            try:
                _replicate_one(sc, item, conns)
            finally:
                sc.unpin(item)
    for c in conns.values():
        c.close()


def _replicate_one(sc, h, conns: dict) -> None:
    while not sc.stopping.is_set():
        try:
            targets = sc.targets()
            break
        except (PeerError, CatalogError) as err:
            log.debug("replication of step %d waits: %s", h.step, err)
            if h.evicted or sc.stopping.wait(0.2):
                return
    else:
        return
    ok = 0
    for t in targets:
        for attempt in (1, 2):
            try:
                c = conns.get(t)
                if c is None:
                    c = conns[t] = sc.peer(t)
                t0 = time.perf_counter()
                c.put(kind=h.kind, name=h.name, step=h.step, rank=h.rank, blob=h.buf[: h.nbytes], meta=h.meta)
                seconds = time.perf_counter() - t0
                sc.metrics.replicated_bytes.inc(h.nbytes)
                log.info("replicated %s step %d to rank %d", h.kind, h.step, t, extra={
                    "event": "replicated", "step": h.step, "target": t, "nbytes": h.nbytes, "seconds": seconds})
                ok += 1
                break
            except (PeerError, ChecksumError, CatalogError, OSError) as err:
                bad = conns.pop(t, None)
                if bad is not None:
                    bad.close()
                kind = "checksum" if isinstance(err, ChecksumError) else "peer"
                sc.metrics.errors.labels(kind).inc()
                log.warning("replicating %s step %d to rank %d failed (attempt %d): %s", h.kind, h.step, t, attempt, err)
    if h.kind == "shard" and ok == len(targets):
        sc.latest_replicated = max(sc.latest_replicated, h.step)
        if sc.s.required_tier == "L1":
            sc.advance(h.step)
    sc.update_gauges()


def persister(sc) -> None:
    """Persist the newest due checkpoint to L2 straight from memory; retries until it lands.

    Blob first (the storage client retries transient errors); the rank completing the set writes the manifest
    (the commit marker) last. While storage is down, L0/L1 go on and the newest due step waits
    here; older due steps are superseded. Never blocks the trainer.
    """
    backoff = 0.5
    while not sc.stopping.is_set():
        with sc.persist_cv:
            while sc.persist_due is None and not sc.stopping.is_set():
                sc.persist_cv.wait(1.0)
            h = sc.persist_due
        if h is None:
            return
        try:
            _persist_one(sc, h)
            backoff = 0.5
            with sc.persist_cv:
                if sc.persist_due is h:
                    sc.persist_due = None
            sc.unpin(h)
        except (StorageError, CatalogError, ManifestError, OSError) as err:
            sc.metrics.errors.labels("storage" if not isinstance(err, CatalogError) else "catalog").inc()
            log.warning("persisting step %d failed; retrying in %.1f s: %s", h.step, backoff, err)
            sc.stopping.wait(backoff)
            backoff = min(backoff * 2, 10.0)
            with sc.persist_cv:
                if sc.persist_due is not h:  # superseded meanwhile
                    sc.unpin(h)


def _persist_one(sc, h) -> None:
    from lifeline.checkpoint import ShardMetadata, blob_key, commit

    t0 = time.perf_counter()
    put = sc.uploader.put if sc.uploader is not None else sc.storage.put  # S3: parts straight from the arena
    put(blob_key(sc.prefix, sc.job, h.step, h.rank), h.buf[: h.nbytes])
    sc.metrics.persisted_bytes.inc(h.nbytes)
    seconds = time.perf_counter() - t0
    log.info("persisted step %d rank %d", h.step, h.rank, extra={
        "event": "persisted", "step": h.step, "nbytes": h.nbytes, "seconds": seconds})
    if sc.catalog.mark_persisted(h.step, h.rank):
        metas = sc.catalog.metas(h.step)
        missing = [r for r, m in enumerate(metas) if m is None]
        if missing:
            raise CatalogError(f"metadata of ranks {missing} missing for step {h.step}", job=sc.job, step=h.step)
        shards = [ShardMetadata.from_json(m) for m in metas]
        commit(sc.storage, sc.prefix, sc.job, h.step, shards[0].layout, shards)  # checks blobs; manifest last
        for r in range(sc.s.world_size):
            sc.catalog.add_holding(h.step, r, "L2")
        log.info("committed step %d to L2 (manifest written last)", h.step)
        if sc.s.required_tier == "L2":
            sc.advance(h.step)
    sc.latest_persisted = max(sc.latest_persisted, h.step)
    sc.metrics.persistence_lag.set(max(0, sc.latest_sealed - sc.latest_persisted))


def heartbeat(sc) -> None:
    """Refresh the registration (TTL = 3 periods); after a Redis restart or outage re-register every holding."""
    period = sc.s.heartbeat_seconds
    while True:
        try:
            was = sc.catalog.is_registered(sc.rank)
            sc.catalog.register(_info(sc), ttl_seconds=3 * period)
            if sc.catalog_dirty or not was:
                _resync(sc)
                sc.catalog_dirty = False
            latest = sc.catalog.latest_complete_step()
            if latest is not None:
                sc.store.latest_complete = max(sc.store.latest_complete, latest)
                sc.metrics.latest_complete.set(latest)
        except CatalogError as err:
            if not sc.catalog_dirty:
                log.warning("catalog unreachable: %s", err)
            sc.catalog_dirty = True
            sc.metrics.errors.labels("catalog").inc()
        sc.update_gauges()
        if sc.stopping.wait(period):
            return


def _info(sc) -> SidecarRegistration:
    return SidecarRegistration(sc.rank, sc.s.node, sc.s.pod_ip, sc.peer_port, sc.metrics_port, os.getpid())


def _resync(sc) -> None:
    """Re-register every shard held in memory, then re-try advancing each held step."""
    steps = set()
    for h in sc.store.items():
        if h.kind != "shard":
            continue
        sc.catalog.add_holding(h.step, h.rank, h.tier, sc.rank, h.meta)
        steps.add(h.step)
    for step in sorted(steps):
        latest = sc.catalog.try_advance(step, sc.s.required_tier)
        sc.store.latest_complete = max(sc.store.latest_complete, latest)
    log.info("catalog (re)registered %d holdings", len(sc.store.items()))
