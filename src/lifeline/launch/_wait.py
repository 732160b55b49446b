"""Wait for the next supervision round, woken at once by any process that exits (Linux pidfds)."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Iterable

__all__ = ["ExitWaiter"]


class ExitWaiter:
    """Sleeps until a timeout or until one of the given processes exits, whichever comes first.

    Keeps one pidfd per live process between calls (closing those of processes no longer given).
    Without pidfds (an old kernel) the timeout alone bounds the wait.
    """

    def __init__(self) -> None:
        self._fds: dict[int, tuple[int, subprocess.Popen]] = {}

    def wait(self, procs: Iterable[subprocess.Popen | None], seconds: float) -> None:
        """Sleep ``seconds`` or until one of ``procs`` (``None`` entries ignored) exits."""
        live = {p.pid: p for p in procs if p is not None and p.returncode is None}
        for pid in [p for p in self._fds if p not in live or self._fds[p][1] is not live[p]]:
            os.close(self._fds.pop(pid)[0])
        for pid, proc in live.items():
            if pid not in self._fds:
                try:
                    self._fds[pid] = (os.pidfd_open(pid), proc)
                except (AttributeError, OSError):
                    continue
        fds = [fd for fd, _ in self._fds.values()]
        if fds:
            select.select(fds, [], [], seconds)
        else:
            time.sleep(seconds)

    def close(self) -> None:
        """Close every pidfd (idempotent)."""
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()
