"""The bench's side of the crash zygote (:mod:`._crash_zygote`): commands, output lines, SIGKILL."""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from lifeline.errors import LifelineError


class Zygote:
    """A running ``python -m lifeline.bench._crash_zygote`` with ``cfg``; its victims' lines on a queue.

    Args:
        cfg: the zygote's configuration (JSON-serialisable; see :mod:`._crash_zygote`).
        log: file for the zygote's and victims' stderr.
    """

    def __init__(self, cfg: dict[str, Any], log: Path) -> None:
        self.log = log
        self._err = open(log, "w")  # noqa: SIM115 - open for the zygote's life, closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "lifeline.bench._crash_zygote", json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name="crash-zygote-out").start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def send(self, command: str) -> None:
        """Write one command line (``save STEP SEED HOLD`` or ``sidecar RANK``)."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float = 120.0) -> list[str]:
        """The fields of the next output line starting with ``prefix`` (other lines are skipped).

        Raises:
            LifelineError: a victim reported ``error ...``, the zygote exited, or no such line came
                within ``timeout`` seconds (the message carries the tail of the zygote's stderr).
        """
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise LifelineError(f"bench crash: no {prefix!r} line within {timeout:g} s; stderr: {self.tail()}") \
                    from None
            if line is None:
                raise LifelineError(f"bench crash: the zygote exited; stderr: {self.tail()}")
            if line.startswith("error"):
                raise LifelineError(f"bench crash: a victim failed: {line}; stderr: {self.tail()}")
            if line.startswith(prefix + " "):
                return line[len(prefix):].split()

    def tail(self) -> str:
        self._err.flush()
        return self.log.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        """Close stdin (the zygote exits) and kill its process group (victims still alive)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._err.close()


def sigkill(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL ``pid`` and await its exit (a pidfd; no polling). No error when it already exited."""
    if pid <= 1:
        raise LifelineError(f"bench crash: refusing to kill pid {pid}")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not select.select([fd], [], [], timeout)[0]:
            raise LifelineError(f"bench crash: process {pid} still alive {timeout:g} s after SIGKILL")
    finally:
        os.close(fd)
