"""Process helpers: free ports, port checks, daemon start, group stop, polling with deadlines."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

from lifeline.devcluster._identity import ProcessRef
from lifeline.errors import ClusterError

T = TypeVar("T")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, what: str, *, host: str = "127.0.0.1", option: str | None = None) -> None:
    """Raise :class:`ClusterError` naming ``what`` and the fix when ``host:port`` is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            fix = f"stop the process listening there (`ss -ltnp 'sport = :{port}'` shows it)"
            if option:
                fix += f" or pass {option} with a free port"
            raise ClusterError(f"port {port} for {what} on {host} is already taken; fix: {fix}",
                               key=f"{host}:{port}", field=option) from None


def wait_until(cond: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05,
               check: Callable[[], None] | None = None) -> T:
    """Poll ``cond()`` until it returns a truthy value or ``timeout`` seconds pass.

    Exceptions from ``cond`` count as "not yet". ``check`` runs each round and may raise
    to abort early (e.g. the server process died).

    Raises:
        ClusterError: the deadline passed; the message names ``what`` and the last error.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if check is not None:
            check()
        try:
            value = cond()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - polling: any failure means "not yet"
            last = err
        if time.monotonic() >= deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


def spawn(argv: list[str], *, log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` as a daemon: its own session (so it outlives the caller), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (SIGSTOP): the state of a frozen node agent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (FileNotFoundError, IndexError):
        return False


def kill_group(target: int | ProcessRef, sig: int) -> None:
    """Send ``sig`` to the process group led by ``target`` (ignoring a group already gone).

    A :class:`ProcessRef` (a pid read from a record) is checked first: a stranger that has its pid
    by now is left alone. A bare pid is for a process this caller started and has not reaped.
    """
    if isinstance(target, ProcessRef):
        target.signal_group(sig)
        return
    try:
        os.killpg(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(target: int | ProcessRef, *, grace: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group led by ``target``, wait up to ``grace`` seconds, then SIGKILL it.

    ``target`` is a :class:`ProcessRef` read from a record, or the pid of ``proc`` (a process this
    caller started); either way the leader is followed by identity, so a pid reused while the group
    winds down is never signalled.
    """
    if proc is not None and proc.poll() is not None:
        return  # reaped: its pid may name another process already
    ref = target if isinstance(target, ProcessRef) else ProcessRef.of(target)
    if not ref.alive():
        _reap(proc)
        return
    kill_group(ref, signal.SIGCONT)  # a frozen (SIGSTOPped) process cannot act on SIGTERM
    kill_group(ref, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(proc)
        if not ref.alive():
            break
        time.sleep(0.05)
    kill_group(ref, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while ref.alive() and time.monotonic() < deadline:
        _reap(proc)
        time.sleep(0.02)
    _reap(proc)


def _reap(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        try:
            proc.poll()
        except Exception:  # noqa: BLE001
            pass
