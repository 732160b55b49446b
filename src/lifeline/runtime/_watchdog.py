"""The generation watchdog: survivors leave a broken collective within a second of a newer plan.

A survivor blocked in a gloo operation (a pipeline send/recv, a tensor-parallel all-reduce, an
expert all-to-all, a ZeRO all-gather) with a peer that died or was re-planned would otherwise wait
out the whole collective timeout (``LIFELINE_COLLECTIVE_TIMEOUT_SECONDS``) — long enough for the
controller to declare it silent and replace a healthy pod. Torch's gloo process groups offer no
working abort (``ProcessGroup.abort``/``shutdown``, ``_abort_process_group`` and the backend's
``abort`` return at once and leave a pending ``recv`` blocked: measured with torch 2.15), so the
watchdog breaks the generation's TCP connections instead:

* :meth:`Watchdog.reset` (at each join) forgets the previous generation's connections;
  :meth:`Watchdog.mark` (just before ``init_process_group``, and before the trainer builds its
  sub-groups) snapshots the process's socket inodes; :meth:`Watchdog.arm` (right after either)
  adds every TCP connection opened since the mark — the generation's gloo pairs — leaving out
  listening sockets and any connection to or from an excluded port (Redis, the rendezvous
  ``TCPStore``). Only connections opened between a mark and its arm are ever watched (another
  thread's opened in that window would be too: none does while a trainer joins);
* a daemon thread reads the catalog's generation every :attr:`Watchdog.interval` seconds (one Redis
  GET; ``CatalogError`` while Redis is away is ignored) and, once it exceeds the armed generation
  (a newer recovery plan is published: ``Catalog.put_plan`` stores both atomically), calls
  ``shutdown(SHUT_RDWR)`` on those connections: gloo's I/O loop sees them close and every pending
  operation of the main thread raises a ``RuntimeError`` (``... Connection closed by peer ...``)
  that :func:`~lifeline.runtime.is_collective_error` recognises. Nothing else is touched: the
  trainer and its tensors stay, and ``destroy_process_group`` then a fresh ``init_process_group``
  of the next generation work in the same process;
* :meth:`Watchdog.disarm` (in teardown, before ``destroy_process_group``) stops it for that
  generation, under the same lock as a break.

A socket is matched by its inode on a ``dup`` of the descriptor, never by descriptor number alone,
so a descriptor closed and reused by another socket meanwhile is never shut down.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable

from lifeline.errors import CatalogError

__all__ = ["Watchdog", "tcp_connections", "socket_inodes"]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's ``st`` column


def socket_inodes() -> dict[int, int]:
    """This process's open sockets: descriptor -> socket inode (``/proc/self/fd``; empty off Linux)."""
    out: dict[int, int] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (ValueError, OSError):  # the listing's own descriptor, or one closed meanwhile
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[fd] = st.st_ino
    return out


def tcp_connections() -> dict[int, tuple[int, int, str]]:
    """TCP sockets of this network namespace: inode -> (local port, remote port, state hex) from
    ``/proc/net/tcp`` and ``/proc/net/tcp6`` (state ``0A`` is LISTEN, ``01`` ESTABLISHED)."""
    out: dict[int, tuple[int, int, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10:
                continue
            try:
                inode = int(cols[9])
                local, remote = int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)
            except (ValueError, IndexError):
                continue
            if inode:
                out[inode] = (local, remote, cols[3])
    return out


class Watchdog:
    """Breaks the armed generation's gloo connections when the catalog moves past it.

    Args:
        generation: reads the catalog's current generation (one Redis GET); may raise
            :class:`~lifeline.errors.CatalogError`, which is ignored (polled again).
        on_break: called on the watchdog thread after a break with ``(generation, seconds,
            sockets)``: the generation broken, seconds from the first look that saw the newer
            generation to the end of the break, and how many connections were shut down.
        interval: seconds between two looks at the catalog while armed (0.25: a survivor leaves a
            broken collective within about 0.3 s of the plan's publication).
    """

    def __init__(self, generation: Callable[[], int], on_break: Callable[[int, float, int], None] | None = None,
                 interval: float = 0.25) -> None:
        self._read_generation = generation
        self._on_break = on_break
        self.interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: int | None = None  # the generation watched, None while disarmed
        self._inodes: frozenset[int] = frozenset()
        self._before: frozenset[int] = frozenset()
        self._exclude: frozenset[int] = frozenset()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.broken: list[int] = []  # generations broken, in order (for tests and reports)

    # --- main thread -----------------------------------------------------------------------------
    def reset(self, exclude_ports: Iterable[int | None] = ()) -> None:
        """Start a new generation's watch: disarm and forget the watched connections.
        ``exclude_ports``: ports whose connections (either end) are never broken (Redis, the
        rendezvous store; ``None`` entries are ignored)."""
        with self._lock:
            self._armed = None
            self._inodes = frozenset()
            self._exclude = frozenset(p for p in exclude_ports if p)

    def mark(self) -> None:
        """Remember the sockets open now: the next :meth:`arm` adds only those opened later."""
        before = frozenset(socket_inodes().values())
        with self._lock:
            self._before = before

    @property
    def watched(self) -> frozenset[int]:
        """Inodes of the connections armed now (empty while disarmed)."""
        with self._lock:
            return self._inodes if self._armed is not None else frozenset()

    def arm(self, generation: int) -> int:
        """Watch ``generation``: add every TCP connection opened since :meth:`mark`, except
        listeners and excluded ports, to the connections broken when the catalog's generation
        exceeds ``generation``. Returns how many connections are watched in all."""
        current = socket_inodes().values()
        tcp = tcp_connections()
        with self._lock:
            inodes = set(self._inodes)
            for inode in current:
                if inode in self._before or inode not in tcp:  # older, or not TCP (a Unix socket)
                    continue
                local, remote, state = tcp[inode]
                if state == _LISTEN or local in self._exclude or remote in self._exclude:
                    continue
                inodes.add(inode)
            self._inodes = frozenset(inodes)
            self._armed = generation
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="lifeline-watchdog", daemon=True)
                self._thread.start()
            self._wake.notify_all()
            return len(inodes)

    def disarm(self) -> None:
        """Stop watching (call before ``destroy_process_group``: afterwards no break is running or
        will run for the generation that was armed). Never raises."""
        with self._lock:
            self._armed = None
            self._inodes = frozenset()

    def close(self) -> None:
        """Disarm and end the thread (it exits within one interval). Never raises."""
        with self._lock:
            self._armed = None
            self._inodes = frozenset()
            self._closed = True
            self._wake.notify_all()

    # --- watchdog thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while self._armed is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                armed = self._armed
            try:
                current = self._read_generation()
            except CatalogError:  # Redis away: a real failure still surfaces as a collective error
                current = None
            except Exception:  # noqa: BLE001 - the watchdog must never die of a bad read
                current = None
            if current is not None and current > armed:
                seen = time.monotonic()
                count = self._break(armed)
                if count is not None and self._on_break is not None:
                    try:
                        self._on_break(armed, time.monotonic() - seen, count)
                    except Exception:  # noqa: BLE001 - reporting is best-effort
                        pass
            with self._lock:
                if not self._closed:
                    self._wake.wait(self.interval)

    def _break(self, generation: int) -> int | None:
        """Shut down the watched connections of ``generation`` (still armed); returns how many, or
        ``None`` when it was disarmed meanwhile. Leaves the watchdog disarmed."""
        with self._lock:
            if self._armed != generation:
                return None
            inodes, self._armed, self._inodes = self._inodes, None, frozenset()
            count = 0
            for fd in list(socket_inodes()):
                try:
                    dup = os.dup(fd)  # holds the open file: fd may be closed and reused meanwhile
                except OSError:
                    continue
                try:
                    st = os.fstat(dup)
                    if not stat.S_ISSOCK(st.st_mode) or st.st_ino not in inodes:
                        continue
                    s = socket.socket(fileno=dup)
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                        count += 1
                    except OSError:  # already closed by the peer
                        pass
                    finally:
                        s.detach()
                finally:
                    os.close(dup)
            self.broken.append(generation)
            return count
