"""The sidecar process: the software DPU that holds (L0), replicates (L1) and persists (L2) checkpoints.

Collaborators (each in its own module): :class:`~._memory.Memory` (arena slots, replica buffers,
holdings), :class:`~._link.CatalogLink` (the catalog, surviving Redis outages),
:class:`~._peers.Peers` (placement and peer connections), :class:`~._restore.Restorer`
(restores from the nearest verified copy) and the workers of :mod:`._workers`.

Threads (all daemons, stopped by :meth:`Sidecar.stop`):

* ``uds`` — accepts trainer connections on the Unix socket (:mod:`._trainer_conn`).
* ``peer`` — accepts authenticated peer connections on TCP (:mod:`._peer_conn`).
* ``sealer`` — checksums each committed slot (``seal_shard``) off the trainer's path and files it.
* ``replicator`` / ``persister`` / ``heartbeat`` — :mod:`._workers`.
* ``http`` — ``/metrics`` and ``/healthz``.

:func:`run_sidecar` runs one until SIGTERM/SIGINT; after a SIGTERM with ``LIFELINE_PREEMPT_GRACE_SECONDS`` > 0 it
keeps serving until its trainer left (:mod:`._drain`).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from lifeline.api.pod import SidecarSettings
from lifeline.catalog import Catalog, SidecarRegistration
from lifeline.checkpoint import Storage, StorageOptions, SupportsUploader, Uploader, storage_from_uri
from lifeline.errors import ChecksumError
from lifeline.sidecar import _format, _peer_conn, _trainer_conn
from lifeline.sidecar._drain import drain
from lifeline.sidecar._link import CatalogLink
from lifeline.sidecar._memory import Memory
from lifeline.sidecar._peers import Peers
from lifeline.sidecar._restore import Restorer
from lifeline.sidecar._windows import WindowPersister
from lifeline.sidecar._workers import Heartbeat, PersistDue, Persister, Replicator, Watermarks
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
        self.stopping = threading.Event()
        self.memory = Memory(settings, self.stopping, self._on_evict, self._release)
        self.catalog = Catalog(settings.redis_url, self.job, settings.world_size, username=settings.redis_username,
                               password=settings.redis_password.get_secret_value())
        self.link = CatalogLink(self.catalog, self.metrics, self.memory.store, rank=self.rank,
                                required_tier=settings.required_tier)
        self.peers = Peers(settings, self.catalog, self.secret,
                           on_refuse=lambda err: self.metrics.errors.labels("auth").inc())
        found = self._make_storage() if settings.persist_enabled else None
        self.storage: Storage | None = found[0] if found else None
        self.prefix = found[1] if found else ""
        self.uploader = self._make_uploader()
        self.windows: WindowPersister | None = None
        """Persists the rank's sparse-checkpoint slots to L2 (only when the sidecar persists)."""
        self.restorer = Restorer(self.memory, self.link, self.peers, found, job=self.job, rank=self.rank,
                                 wait_sealed=self.wait_sealed)
        self.marks = Watermarks()
        self.seal_q: queue.Queue = queue.Queue()
        self.repl_q: queue.Queue = queue.Queue()
        self.persist_due = PersistDue(self.memory)
        self._threads: list[threading.Thread] = []
        self._sealing = 0  # committed slots not yet sealed and filed
        self._trainers = 0  # trainer connections open (a draining sidecar waits for none)
        self._sockets: list[socket.socket] = []
        self.http = None
        self.peer_port = 0
        self.metrics_port = 0

    # ------------------------------------------------------------------ what handlers use
    @property
    def store(self) -> Store:
        """The holdings in memory."""
        return self.memory.store

    @property
    def catalog_dirty(self) -> bool:
        """The catalog has not been resynchronised since it was last unreachable."""
        return self.link.dirty

    def catalog_try(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`CatalogLink.call`."""
        return self.link.call(fn, *args, **kwargs)

    def acquire_slot(self, timeout: float | None, cancelled: Callable[[], bool] | None = None) -> int | None:
        """See :meth:`Memory.acquire_slot`."""
        return self.memory.acquire_slot(timeout, cancelled)

    def release_slot(self, slot: int) -> None:
        self.memory.release_slot(slot)

    def take_buffer(self, nbytes: int) -> memoryview:
        return self.memory.take_buffer(nbytes)

    def give_buffer(self, buf: memoryview) -> None:
        self.memory.give_buffer(buf)

    def unpin(self, h: Holding) -> None:
        self.memory.unpin(h)

    def fetch(self, step: int | None, rank: int) -> tuple[Holding, str]:
        """See :meth:`Restorer.fetch`."""
        return self.restorer.fetch(step, rank)

    def report_corrupt(self, err: ChecksumError, tier: str, where: str) -> None:
        """See :meth:`CatalogLink.report_corrupt`."""
        self.link.report_corrupt(err, tier, where)

    def peer(self, rank: int, timeout: float = 30.0) -> PeerClient:
        """See :meth:`Peers.connect`."""
        return self.peers.connect(rank, timeout)

    # ------------------------------------------------------------------ setup
    def _make_storage(self) -> tuple[Storage, str]:
        """``(storage, prefix)`` for ``LIFELINE_PERSIST_URI``, object-storage options from the settings."""
        s = self.s
        return storage_from_uri(s.persist_uri, StorageOptions(
            endpoint=s.s3_endpoint, access_key=s.s3_access_key, secret_key=s.s3_secret_key.get_secret_value(),
            secure=s.s3_secure, retries=s.persist_retries))

    def _make_uploader(self) -> Uploader | None:
        """The storage's fast upload path when it declares one (:class:`SupportsUploader`; S3: parts straight
        from the arena, crc32c-checked in transit); ``None``: the persister calls ``storage.put``."""
        st = self.storage
        return st.uploader(retries=self.s.persist_retries) if isinstance(st, SupportsUploader) else None

    def _registration(self) -> SidecarRegistration:
        return SidecarRegistration(self.rank, self.s.node, self.s.pod_ip, self.peer_port, self.metrics_port,
                                   os.getpid())

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
        common = dict(memory=self.memory, link=self.link, metrics=self.metrics, marks=self.marks,
                      stopping=self.stopping)
        self._spawn("uds", self._accept_loop, uds, _trainer_conn.serve_trainer)
        self._spawn("peer", self._accept_loop, tcp, _peer_conn.serve_peer)
        self._spawn("sealer", self._sealer)
        self._spawn("replicator", Replicator(self.repl_q, self.memory, self.peers, self.link, self.metrics,
                                             self.marks, self.stopping, self.update_gauges).run)
        if self.storage is not None:
            put = self.uploader.put if self.uploader is not None else self.storage.put
            self._spawn("persister", Persister(self.persist_due, self.storage, self.prefix, put, job=self.job,
                                               **common).run)
            self.windows = WindowPersister(self.storage, self.prefix, put, job=self.job, rank=self.rank,
                                           memory=self.memory, link=self.link, metrics=self.metrics,
                                           stopping=self.stopping)
            self._spawn("windows", self.windows.run)
        self._spawn("heartbeat", Heartbeat(self.link, self.memory, self._registration, period=s.heartbeat_seconds,
                                           metrics=self.metrics, stopping=self.stopping,
                                           on_change=self.update_gauges).run)
        log.info("sidecar started", extra={"job": self.job, "rank": self.rank, "peer": f"{s.pod_ip}:{self.peer_port}",
                                           "metrics_port": self.metrics_port, "arena": str(s.arena_dir)})
        return self

    def _spawn(self, name: str, fn: Callable, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, name=f"sidecar-{self.rank}-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self, lsock: socket.socket, handler: Callable) -> None:
        while not self.stopping.is_set():
            try:
                conn, addr = lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(handler, conn, addr), daemon=True,
                             name=f"sidecar-{self.rank}-conn").start()

    def _handle(self, handler: Callable, conn: socket.socket, addr: Any) -> None:
        trainer = handler is _trainer_conn.serve_trainer
        with self.store.cond:
            self._trainers += trainer
        try:
            handler(self, conn, addr)
        except Exception:  # one connection never takes the sidecar down
            log.exception("connection handler failed", extra={"peer": str(addr)})
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self.store.cond:
                self._trainers -= trainer

    def trainer_connections(self) -> int:
        """Trainer connections open on the Unix socket (one per live trainer client)."""
        with self.store.cond:
            return self._trainers

    def replication_idle(self) -> bool:
        """Every committed slot is sealed and every queued copy was sent (or given up) to the peers."""
        with self.store.cond:
            sealing = self._sealing
        return sealing == 0 and self.repl_q.unfinished_tasks == 0

    def stop(self, *, unlink: bool = True) -> None:
        """Stop every thread, close sockets and the arena (removing its files when ``unlink``)."""
        self.stopping.set()
        for sk in self._sockets:
            try:
                sk.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sk.close()
        self.persist_due.wake()
        if self.windows is not None:
            self.windows.stop()
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
        self.memory.close(unlink=unlink)  # frees the Memory-backed pages once every mapping is gone
        self.catalog.close()

    def health(self) -> tuple[bool, str]:
        """``(ok, detail)`` for ``/healthz``: threads alive and the catalog reachable."""
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            return False, f"threads stopped: {', '.join(dead)}"
        return True, "ok (catalog resynchronising)" if self.link.dirty else "ok"

    def _release(self, h: Holding) -> bool:
        """Forget this sidecar's catalog entry of ``h`` before evicting it, unless a plan spared its step
        (then keep it). With the catalog unreachable no plan can spare anything: evict (the entry is
        dropped at the resynchronisation)."""
        if self.link.dirty:
            return True
        return self.link.call(self.catalog.release_holding, h.step, h.rank, h.tier, self.rank) is not False

    def _on_evict(self, h: Holding) -> None:
        if h.kind == "shard":
            self.link.call(self.catalog.remove_holding, h.step, h.rank, h.tier, self.rank)

    def update_gauges(self) -> None:
        store, marks = self.memory.store, self.marks
        self.metrics.held_bytes.labels("L0").set(store.held_bytes("L0"))
        self.metrics.held_bytes.labels("L1").set(store.held_bytes("L1"))
        self.metrics.replication_lag.set(max(0, marks.sealed - marks.replicated) if self.s.peer_replicas else 0)

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
                meta = _format.seal(plan, self.memory.arena.view(slot, nbytes), job=self.job, step=step)
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
        h = self.memory.hold_slot(slot, step, self.rank, nbytes, meta)  # pinned for replication/persistence
        self.marks.sealed = max(self.marks.sealed, step)
        self.metrics.latest_step.set(self.marks.sealed)
        self.link.call(self.catalog.add_holding, step, self.rank, "L0", self.rank, meta)
        if self.s.required_tier == "L0":
            self.link.advance(step)
        if self.storage is not None and step % self.s.persist_every == 0:
            h.pins += 1
            self.persist_due.offer(h)
        if self.s.peer_replicas > 0:
            self.repl_q.put(h)
        else:
            self.unpin(h)
        self.update_gauges()
        return h


def run_sidecar(settings: SidecarSettings) -> None:
    """Run a sidecar until SIGTERM or SIGINT (the ``python -m lifeline sidecar`` entry point). After a SIGTERM
    with ``settings.preempt_grace_seconds`` > 0 it first drains (:func:`lifeline.sidecar._drain.drain`)."""
    sc = Sidecar(settings).start()
    done = threading.Event()
    got: list[tuple[int, float]] = []

    def _stop(signum, frame):
        got.append((signum, time.monotonic()))
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    signum, since = got[0]
    if signum == signal.SIGTERM and settings.preempt_grace_seconds > 0:
        drain(sc, settings.preempt_grace_seconds, since=since)
    log.info("sidecar stopping")
    sc.stop(unlink=True)
