"""A recorded process by identity, not by number: its pid and its start time.

A pid written to a file (a container's pid file, the cluster's state) outlives the process: once it
exits, the kernel hands the number to the next process that asks, and with the usual
``pid_max`` of 32768 a busy machine wraps around in minutes. A signal sent through a stale pid
lands on a stranger: a SIGSTOP meant for a hung trainer froze another program for good. Every
signal this package sends through a recorded pid therefore goes through :class:`ProcessRef`,
which checks the start time (field 22 of ``/proc/<pid>/stat``, clock ticks after boot) and sends
through a pidfd, so a process that exits between the check and the signal is not replaced by
another one under the same number.
"""

from __future__ import annotations

import os
import signal as _signal
from dataclasses import dataclass

__all__ = ["ProcessRef", "start_time"]


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks after boot, or ``None`` when no such process
    exists (field 22 of ``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessRef:
    """Process ``pid`` that started at ``start`` (clock ticks after boot; ``None``: a record written
    before start times were kept, which is not checked).

    Its text form, as stored in pid files, is ``"<pid> <start>"`` (or ``"<pid>"``).
    """

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        """The process that has ``pid`` now (call it right after starting the process)."""
        return cls(pid, start_time(pid))

    @classmethod
    def parse(cls, text: str) -> ProcessRef:
        """``"<pid> <start>"`` or ``"<pid>"`` → a ref. Raises ``ValueError`` for anything else."""
        parts = text.split()
        if len(parts) not in (1, 2):
            raise ValueError(f"not a process record: {text!r}")
        return cls(int(parts[0]), int(parts[1]) if len(parts) == 2 else None)

    def __str__(self) -> str:
        return f"{self.pid}" if self.start is None else f"{self.pid} {self.start}"

    def _same(self) -> bool:
        return self.start is None or start_time(self.pid) == self.start

    def alive(self) -> bool:
        """Whether this process (not merely some process with its pid) runs and is not a zombie."""
        return _state(self.pid) not in (None, "Z", "X") and self._same()

    def stopped(self) -> bool:
        """Whether this process is stopped by a signal (SIGSTOP)."""
        return _state(self.pid) == "T" and self._same()

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to this process; ``False`` (nothing sent) when it is gone or its pid now names
        another process."""
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self._same():
                return False
            _signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the process group this process leads; ``False`` when nothing was sent.

        A live process under the leader's pid that started at another time is a stranger: nothing is
        sent. When no process has the pid, the group may still have members (the kernel does not
        reuse a number while a group holds it), so the group is signalled.
        """
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            fd = None
        try:
            if fd is not None and not self._same():
                return False
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            if fd is not None:
                os.close(fd)
