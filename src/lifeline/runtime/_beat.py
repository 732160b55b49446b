"""The recovery beat: while a trainer starts or recovers, a thread records every second that it is alive.

A starting or recovering trainer spends most of its time waiting (for the plan, the rendezvous, its
peers' restores, a localized replay) and reports nothing then, so silence alone cannot tell a waiting
trainer from a frozen one (SIGSTOP, a device that stopped answering): the engine used to give every
silent rank the whole start-up grace (``startupGraceSeconds``, 120 s in the chaos trials). A frozen
process stops all its threads, this one too; the engine judges a rank that stopped beating while
another still beats by ``hangTimeoutSeconds`` (docs/control.md "Hangs during a recovery").

The beat is on from :func:`lifeline.runtime.init` until the first step after the start, and again
from a failure until the first step after its recovery: a rank blocked in that first step's
collective (its peer still restores) keeps beating. While training, step reports are the liveness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lifeline.errors import LifelineError

__all__ = ["RecoveryBeat", "BEAT_SECONDS"]

BEAT_SECONDS = 1.0
"""Seconds between two beats (one Redis HSET each, only while starting or recovering)."""


class RecoveryBeat:
    """Calls ``beat()`` every ``interval`` seconds on a daemon thread while :attr:`on` is true.

    Args:
        beat: records the beat (``Catalog.beat`` of this rank); a :class:`LifelineError` or
            ``OSError`` it raises is ignored (Redis away: the beat is best-effort, as progress is).
        interval: seconds between beats.
    """

    def __init__(self, beat: Callable[[], None], interval: float = BEAT_SECONDS) -> None:
        self._beat = beat
        self.interval = interval
        self._on = False
        self._closed = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def on(self) -> bool:
        """Whether the thread beats (it beats at once when switched on)."""
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        if value == self._on:
            return
        with self._wake:
            self._on = value
            if value and self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="lifeline-recovery-beat", daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def close(self) -> None:
        """Stop the thread (it is a daemon: a process that exits without closing loses nothing)."""
        with self._wake:
            self._closed = True
            self._on = False
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._on and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self._beat()
            except (LifelineError, OSError):
                pass
            with self._wake:
                self._wake.wait(self.interval)
