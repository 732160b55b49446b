"""The sidecar process: the software DPU that holds (L0), replicates (L1) and persists (L2) checkpoints.

Threads (all daemons, stopped by :meth:`Sidecar.stop`):

* ``uds`` — accepts trainer connections on the Unix socket (:mod:`._trainer_conn`).
* ``peer`` — accepts authenticated peer connections on TCP (:mod:`._peer_conn`).
* ``sealer`` — checksums each committed slot (``seal_shard``) off the trainer's path and files it.
* ``replicator`` / ``persister`` / ``heartbeat`` — :mod:`._workers`.
* ``http`` — ``/metrics`` and ``/healthz``.

:func:`run_sidecar` runs one until SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from typing import Any

from lifeline.api.pod import SidecarSettings
from lifeline.catalog import Catalog, CorruptionReport
from lifeline.control import place_replicas
from lifeline.errors import CatalogError, ChecksumError, PeerError, RecoveryError, SidecarError, StorageError
from lifeline.sidecar import _format
from lifeline.sidecar.arena import Arena
from lifeline.sidecar.metrics import SidecarMetrics, serve_http
from lifeline.sidecar.peer import PeerClient
from lifeline.sidecar.store import Holding, Store

__all__ = ["Sidecar", "run_sidecar"]

log = logging.getLogger("lifeline.sidecar")


class Sidecar:
    """One rank's sidecar. Construct, :meth:`start`, and :meth:`stop`.

    Args:
        settings: the pod's :class:`~lifeline.api.pod.SidecarSettings`.

    Raises:
        ConfigError: the arena cannot be allocated or a setting is inconsistent.
    """

    def __init__(self, settings: SidecarSettings) -> None:
        self.s = settings
        self.job = settings.job
        self.rank = settings.rank
        self.secret = settings.secret.get_secret_value().encode()
        self.metrics = SidecarMetrics()
        self.arena = Arena(settings.arena_dir, settings.slots, settings.slot_bytes)
        self.free_slots: list[int] = list(range(settings.slots))
        self.store = Store(settings.memory_bytes, self._on_evict)
        self.catalog = Catalog(settings.redis_url, self.job, settings.world_size)
        self.storage, self.prefix = self._make_storage() if settings.persist_enabled else (None, "")
        self.uploader = self._make_uploader()
        self.stopping = threading.Event()
        self.seal_q: queue.Queue = queue.Queue()
        self.repl_q: queue.Queue = queue.Queue()
        self.persist_cv = threading.Condition()
        self.persist_due: Holding | None = None
        self.catalog_dirty = True
        self.latest_sealed = -1
        self.latest_replicated = -1
        self.latest_persisted = -1
        self.placement: dict[int, tuple[int, ...]] | None = None
        self.placement_nodes: tuple[str, ...] | None = None
        self._threads: list[threading.Thread] = []
        self._sealing = 0  # committed slots not yet sealed and filed
        self._spares: list[bytearray] = []  # at most one evicted replica buffer, reused by the next
        self._sockets: list[socket.socket] = []
        self.http = None
        self.peer_port = 0
        self.metrics_port = 0

    # ------------------------------------------------------------------ setup
    def _make_storage(self):
        """``(storage, prefix)`` for ``LIFELINE_PERSIST_URI`` (S3 options from the settings)."""
        from lifeline.checkpoint import storage_from_uri

        s = self.s
        kwargs: dict[str, Any] = {}
        if s.persist_uri.startswith("s3://"):
            kwargs = dict(
                endpoint=s.s3_endpoint, access_key=s.s3_access_key,
                secret_key=s.s3_secret_key.get_secret_value(), secure=s.s3_secure, retries=s.persist_retries,
            )
        return storage_from_uri(s.persist_uri, **kwargs)

    def _make_uploader(self):
        """The L2 blob uploader for S3 storage (:mod:`._upload`: parts straight from the arena, crc32c-checked
        in transit), with the storage's bucket, part size and parallelism; None for other storages."""
        from lifeline.sidecar._upload import S3Uploader

        st = self.storage
        if st is None or not self.s.persist_uri.startswith("s3://"):
            return None
        access = self.s.s3_access_key or os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret = self.s.s3_secret_key.get_secret_value() or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        return S3Uploader(st.endpoint, access, secret, st.bucket, secure=self.s.s3_secure, part_size=st.part_size,
                          concurrency=st.max_concurrency, retries=self.s.persist_retries)

    def start(self) -> Sidecar:
        """Bind the sockets, start every thread and register in the catalog (best effort)."""
        s = self.s
        sock_path = str(s.socket_path)
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uds.bind(sock_path)
        os.chmod(sock_path, 0o600)
        uds.listen(16)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((s.pod_ip, s.peer_port))
        tcp.listen(64)
        self.peer_port = tcp.getsockname()[1]
        self._sockets = [uds, tcp]
        if s.metrics_port >= 0:
            self.http = serve_http(s.pod_ip, s.metrics_port, self.metrics, self.health)
            self.metrics_port = self.http.server_address[1]

        # load the format (and torch) now, not while a trainer waits on its first save's commit
        from lifeline.checkpoint import ShardMetadata, ShardPlan, seal_shard  # noqa: F401
        from lifeline.sidecar import _peer_conn, _trainer_conn, _workers

        self._spawn("uds", self._accept_loop, uds, _trainer_conn.serve_trainer)
        self._spawn("peer", self._accept_loop, tcp, _peer_conn.serve_peer)
        self._spawn("sealer", self._sealer)
        self._spawn("replicator", _workers.replicator, self)
        self._spawn("persister", _workers.persister, self)
        self._spawn("heartbeat", _workers.heartbeat, self)
        log.info(
            "sidecar started", extra={"job": self.job, "rank": self.rank, "peer": f"{s.pod_ip}:{self.peer_port}",
                                      "metrics_port": self.metrics_port, "arena": str(s.arena_dir)},
        )
        return self

    def _spawn(self, name: str, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, name=f"sidecar-{self.rank}-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self, lsock: socket.socket, handler) -> None:
        while not self.stopping.is_set():
            try:
                conn, addr = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(handler, conn, addr), daemon=True,
                             name=f"sidecar-{self.rank}-conn").start()

    def _handle(self, handler, conn: socket.socket, addr) -> None:
        try:
            handler(self, conn, addr)
        except Exception:  # one connection never takes the sidecar down
            log.exception("connection handler failed", extra={"peer": str(addr)})
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def stop(self, *, unlink: bool = True) -> None:
        """Stop every thread, close sockets and the arena (removing its files when ``unlink``)."""
        self.stopping.set()
        for sk in self._sockets:
            try:
                sk.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sk.close()
        with self.persist_cv:
            self.persist_cv.notify_all()
        self.seal_q.put(None)
        self.repl_q.put(None)
        if self.http is not None:
            self.http.shutdown()
        for t in self._threads:
            t.join(timeout=10)
        try:
            os.unlink(str(self.s.socket_path))
        except OSError:
            pass
        if self.uploader is not None:
            self.uploader.close()
        self.arena.close(unlink=unlink)  # frees the Memory-backed pages once every mapping is gone
        self.catalog.close()

    # ------------------------------------------------------------------ health
    def health(self) -> tuple[bool, str]:
        """``(ok, detail)`` for ``/healthz``: threads alive and the catalog reachable."""
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            return False, f"threads stopped: {', '.join(dead)}"
        if self.catalog_dirty:
            return True, "ok (catalog resynchronising)"
        return True, "ok"

    # ------------------------------------------------------------------ slots
    def acquire_slot(self, timeout: float | None) -> int | None:
        """A free arena slot, evicting the oldest evictable L0 checkpoint if needed.

        Waits up to ``timeout`` seconds (None: forever, 0: not at all); None when none freed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.store.cond:
                if self.free_slots:
                    return self.free_slots.pop(0)
            if self.store.evict_for_slot(self.rank) is not None:
                continue
            with self.store.cond:
                if self.free_slots:
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self.stopping.is_set():
                    return None
                self.store.cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    def release_slot(self, slot: int) -> None:
        """Return a slot to the free list."""
        with self.store.cond:
            if slot not in self.free_slots:
                self.free_slots.append(slot)
            self.store.cond.notify_all()

    def _on_evict(self, h: Holding) -> None:
        if h.slot is not None and h.pins == 0:
            self.release_slot(h.slot)
        if h.slot is None and h.pins == 0 and h.kind == "shard":
            self.give_buffer(h.buf)
        if h.kind == "shard":
            self.catalog_try(self.catalog.remove_holding, h.step, h.rank, h.tier, self.rank)

    def take_buffer(self, nbytes: int) -> memoryview:
        """A buffer of exactly ``nbytes`` for an incoming replica: a spare one of that size if any
        (already faulted in, so receiving does not page-fault), else a new one."""
        with self.store.cond:
            for i, b in enumerate(self._spares):
                if len(b) == nbytes:
                    return memoryview(self._spares.pop(i))
        return memoryview(bytearray(nbytes))

    def give_buffer(self, buf: memoryview) -> None:
        """Keep a no-longer-used replica buffer as the (single) spare for the next replica."""
        obj = buf.obj if isinstance(buf, memoryview) else buf
        if isinstance(obj, bytearray):
            with self.store.cond:
                self._spares[:] = [obj]

    def unpin(self, h: Holding) -> None:
        """Release a reader's pin; frees an evicted holding's slot once its last reader is done."""
        self.store.unpin(h)
        if h.evicted and h.pins == 0 and h.slot is not None:
            self.release_slot(h.slot)

    # ------------------------------------------------------------------ catalog helpers
    def catalog_try(self, fn, *args, **kwargs):
        """Call a catalog method; on failure count it, mark the catalog for resync, return None."""
        try:
            return fn(*args, **kwargs)
        except CatalogError as err:
            self.metrics.errors.labels("catalog").inc()
            if not self.catalog_dirty:
                log.warning("catalog unavailable; will resynchronise: %s", err)
            self.catalog_dirty = True
            return None

    def advance(self, step: int) -> None:
        """Ask the catalog to advance the latest complete step to ``step`` at the required tier."""
        latest = self.catalog_try(self.catalog.try_advance, step, self.s.required_tier)
        if latest is not None and latest > self.store.latest_complete:
            self.store.latest_complete = latest
            self.metrics.latest_complete.set(latest)

    def update_gauges(self) -> None:
        self.metrics.held_bytes.labels("L0").set(self.store.held_bytes("L0"))
        self.metrics.held_bytes.labels("L1").set(self.store.held_bytes("L1"))
        self.metrics.replication_lag.set(max(0, self.latest_sealed - self.latest_replicated) if self.s.peer_replicas else 0)

    # ------------------------------------------------------------------ sealing
    def commit_slot(self, slot: int, step: int, nbytes: int, plan: Any) -> None:
        """Hand a written slot to the sealer (called by the trainer connection; returns at once)."""
        with self.store.cond:
            self._sealing += 1
        self.seal_q.put((slot, step, nbytes, plan))

    def wait_sealed(self, timeout: float = 60.0) -> None:
        """Wait until every committed slot is sealed and filed (a restore must see the latest save)."""
        with self.store.cond:
            self.store.cond.wait_for(lambda: self._sealing == 0, timeout)

    def _sealer(self) -> None:
        while True:
            item = self.seal_q.get()
            if item is None:
                return
            slot, step, nbytes, plan = item
            try:
                meta = _format.seal(plan, self.arena.view(slot, nbytes), job=self.job, step=step)
            except Exception as err:  # a bad plan must not kill the sealer
                log.error("sealing step %d failed: %s", step, err)
                self.metrics.errors.labels("protocol").inc()
                self.release_slot(slot)
                meta = None
            try:
                if meta is not None:
                    self.file_own(slot, step, nbytes, meta)
            finally:
                with self.store.cond:
                    self._sealing -= 1
                    self.store.cond.notify_all()

    def file_own(self, slot: int, step: int, nbytes: int, meta: str) -> Holding:
        """Hold a sealed slot as this rank's L0 checkpoint and start replication/persistence."""
        h = Holding("shard", step, self.rank, nbytes, self.arena.view(slot, nbytes), meta, "L0", slot)
        h.pins += 1  # replication/persistence pin, dropped by the workers
        self.store.add(h, keep=self.s.keep)
        self.latest_sealed = max(self.latest_sealed, step)
        self.metrics.latest_step.set(self.latest_sealed)
        self.catalog_try(self.catalog.add_holding, step, self.rank, "L0", self.rank, meta)
        if self.s.required_tier == "L0":
            self.advance(step)
        due = self.s.persist_enabled and step % self.s.persist_every == 0
        if due:
            h.pins += 1
            with self.persist_cv:
                old, self.persist_due = self.persist_due, h
                self.persist_cv.notify_all()
            if old is not None:
                self.unpin(old)  # superseded before it reached L2
        if self.s.peer_replicas > 0:
            self.repl_q.put(h)
        else:
            self.unpin(h)
        self.update_gauges()
        return h

    # ------------------------------------------------------------------ placement
    def targets(self) -> tuple[int, ...]:
        """Ranks whose sidecars hold this rank's L1 copies (Gemini placement over live nodes).

        Raises:
            PeerError: not every rank's sidecar is registered yet (placement needs every node).
        """
        regs = self.catalog.sidecars()
        if len(regs) < self.s.world_size:
            missing = sorted(set(range(self.s.world_size)) - set(regs))
            raise PeerError(f"placement waits for sidecars of ranks {missing} to register", job=self.job)
        nodes = tuple(regs[r].node for r in range(self.s.world_size))
        if nodes != self.placement_nodes:
            self.placement = place_replicas(list(nodes), self.s.peer_replicas)
            self.placement_nodes = nodes
        return self.placement[self.rank]

    def peer(self, rank: int, timeout: float = 30.0) -> PeerClient:
        """An authenticated connection to rank's sidecar (address from the catalog)."""
        reg = self.catalog.sidecar(rank)
        if reg is None:
            raise PeerError(f"sidecar of rank {rank} is not registered", job=self.job, rank=rank)
        return PeerClient(reg.host, reg.port, secret=self.secret, job=self.job, chunk_bytes=self.s.chunk_bytes,
                          timeout=timeout, source=self.s.pod_ip)

    # ------------------------------------------------------------------ restore
    def fetch(self, step: int | None, rank: int) -> tuple[Holding, str]:
        """The nearest verified copy of (step, rank) as a pinned holding in this sidecar, and its tier.

        Tries this sidecar's memory (``L0``), then peers holding it (``L1``), then storage (``L2``);
        every copy is verified against the chunk checksums before use, and a corrupt copy is
        reported (log, metric, catalog) and skipped. ``step=None`` means the latest complete step.

        Raises:
            RecoveryError: no tier holds a verified copy.
        """
        self.wait_sealed()
        if step is None:
            step = self.catalog_try(self.catalog.latest_complete_step)
            if step is None:
                held = self.store.steps("shard", rank)
                if not held:
                    raise RecoveryError("no complete checkpoint to restore", job=self.job, rank=rank)
                step = held[-1]
        errors: list[str] = []
        h = self.store.pin("shard", step, rank)
        if h is not None:
            try:
                _format.verify(h.meta, h.buf, rank=rank, step=step, tier="L0")
                if h.slot is not None:
                    return h, "L0"
                try:  # a replica held for a peer: copy it into a slot the trainer can map
                    return self._fetch_into_slot(step, rank, h.meta, "L0", lambda v, h=h: _copy(h, v)), "L0"
                finally:
                    self.unpin(h)
            except ChecksumError as err:
                self.unpin(h)
                self.report_corrupt(err, "L0", f"local@{self.rank}")
                self.store.remove(h)
                errors.append(str(err))
        meta = self.catalog_try(self.catalog.meta, step, rank)
        holders = self.catalog_try(self.catalog.holders, step, rank) or frozenset()
        peers = sorted({h.holder for h in holders if h.holder is not None} - {self.rank})
        for k in peers:
            try:
                return self._fetch_into_slot(step, rank, meta, "L1", lambda v, k=k: self._from_peer(k, step, rank, v)), "L1"
            except ChecksumError as err:
                errors.append(f"rank {k}: {err}")
                self._drop_corrupt(k, step, rank)
            except (PeerError, SidecarError) as err:
                errors.append(f"rank {k}: {err}")
        if self.storage is not None:
            try:
                return self._fetch_into_slot(step, rank, meta, "L2", lambda v: self._from_storage(step, rank, v)), "L2"
            except (StorageError, ChecksumError, SidecarError) as err:
                errors.append(f"L2: {err}")
        raise RecoveryError(
            f"no verified copy of step {step} rank {rank}: {'; '.join(errors) or 'no holders'}",
            job=self.job, rank=rank, step=step,
        )

    def _from_peer(self, k: int, step: int, rank: int, view: memoryview) -> tuple[int, str]:
        with self.peer(k) as pc:
            got, meta = pc.get(kind="shard", step=step, rank=rank, into=view)
            return len(got), meta

    def _from_storage(self, step: int, rank: int, view: memoryview) -> tuple[int, str]:
        from lifeline.checkpoint import blob_key

        meta = self.catalog_try(self.catalog.meta, step, rank)
        if meta is None:
            raise SidecarError("no shard metadata in the catalog for the stored blob", rank=rank, step=step, tier="L2")
        n = _format.blob_nbytes(meta)
        if n > len(view):
            raise SidecarError(f"stored blob of {n} bytes exceeds LIFELINE_SLOT_BYTES", rank=rank, step=step)
        self.storage.get_into(blob_key(self.prefix, self.job, step, rank), 0, view[:n])
        return n, meta

    def _fetch_into_slot(self, step: int, rank: int, meta: str | None, tier: str, read) -> Holding:
        slot = self.acquire_slot(timeout=60.0)
        if slot is None:
            raise SidecarError("no free arena slot to restore into", rank=rank, step=step)
        try:
            nbytes, peer_meta = read(self.arena.view(slot))
            meta = meta or peer_meta
            if not meta:
                raise SidecarError("no shard metadata to verify against", rank=rank, step=step, tier=tier)
            try:
                _format.verify(meta, self.arena.view(slot, nbytes), rank=rank, step=step, tier=tier)
            except ChecksumError as err:
                self.report_corrupt(err, tier, "storage" if tier == "L2" else "peer")
                raise
        except BaseException:
            self.release_slot(slot)
            raise
        h = Holding("shard", step, rank, nbytes, self.arena.view(slot, nbytes), meta, "L0", slot)
        h.pins += 1
        self.store.add(h, keep=self.s.keep)
        self.catalog_try(self.catalog.add_holding, step, rank, "L0", self.rank, meta)
        log.info("restored step %d rank %d from %s", step, rank, tier)
        return h

    def _drop_corrupt(self, k: int, step: int, rank: int) -> None:
        """Forget rank k's corrupt copy of (step, rank): catalog first, then ask k to delete it (best effort)."""
        for tier in ("L0", "L1"):
            self.catalog_try(self.catalog.remove_holding, step, rank, tier, k)
        try:
            with self.peer(k, timeout=5.0) as pc:
                pc.delete(kind="shard", step=step, rank=rank)
        except (PeerError, CatalogError, OSError) as err:
            log.warning("could not ask rank %d to drop its corrupt copy of step %d rank %d: %s", k, step, rank, err)

    def report_corrupt(self, err: ChecksumError, tier: str, where: str) -> None:
        """Report a copy that failed verification: log, metric and a catalog entry."""
        self.metrics.errors.labels("checksum").inc()
        log.error("corrupt copy detected and not used (%s at %s): %s", tier, where, err)
        self.catalog_try(self.catalog.report_corrupt, CorruptionReport(
            step=err.step, rank=err.rank, tier=tier, where=where, by=self.rank, chunk=err.key, error=str(err),
            time=time.time()))


def _copy(h: Holding, view: memoryview) -> tuple[int, str]:
    view[: h.nbytes] = h.buf[: h.nbytes]
    return h.nbytes, h.meta


def run_sidecar(settings: SidecarSettings) -> None:
    """Run a sidecar until SIGTERM or SIGINT (the ``python -m lifeline sidecar`` entry point)."""
    sc = Sidecar(settings).start()
    done = threading.Event()

    def _stop(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    log.info("sidecar stopping")
    sc.stop(unlink=True)
