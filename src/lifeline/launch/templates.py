"""Template processes: spares forked in milliseconds from one process that paid the imports.

A fresh spare (:mod:`lifeline.launch.spare_pool`) costs what a fresh rank process costs: 3–5 CPU-seconds
of Python, torch, dynamo and the runtime's modules, every time. On two shared cores a 4-rank run
paid that for 8 rank processes, their spares and every restart — most of the CPU a recovery test
spent. A :class:`Template` pays it once per role: ``python -m lifeline.launch._template MODULE...``
imports what a spare imports and then forks a spare per request (:meth:`Template.fork`), whose
pages are shared copy-on-write. The forked spare is adopted by this process (it is made a child
subreaper, ``PR_SET_CHILD_SUBREAPER``), so :class:`ForkedProcess` is a real
:class:`subprocess.Popen` of it: ``poll``, ``wait``, signals and exit codes work as for a process
started here. The protocol is in :mod:`lifeline.launch._template`.

What a forked spare shares with its template and a fresh spare would not: the hash seed of
``str`` (``PYTHONHASHSEED``) and anything the imports computed from the environment; the
template's environment is the role's base environment (:func:`lifeline.launch.spare_pool.spare_env`),
as a fresh spare's is. ``random`` reseeds itself after a fork. Linux only; anywhere a template
cannot run (no subreaper, a template that failed its single-thread check or died) the pool falls
back to fresh spares.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from lifeline.errors import ClusterError

__all__ = ["ForkedProcess", "Template", "become_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_REPLY_SECONDS = 30.0


def become_subreaper() -> None:
    """Make this process adopt its orphaned descendants (Linux ``prctl(PR_SET_CHILD_SUBREAPER, 1)``).

    Raises:
        OSError: not Linux, or the call failed (the caller uses fresh processes instead).
    """
    if not sys.platform.startswith("linux"):
        raise OSError(f"a child subreaper needs Linux, not {sys.platform}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")


class Template:
    """One template process of ``role`` (``trainer`` or ``sidecar``) with base environment ``env``,
    preloading ``modules``; it logs to ``log`` (the forked spares log where their caller says).

    Raises:
        OSError: this process cannot adopt forked spares (see :func:`become_subreaper`).
    """

    def __init__(self, role: str, env: Mapping[str, str], log: Path, modules: Iterable[str]) -> None:
        become_subreaper()
        self.role = role
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with open(log, "ab") as handle:
                self.proc = subprocess.Popen([sys.executable, "-m", "lifeline.launch._template", *modules],
                                             env=dict(env), stdin=theirs, stdout=subprocess.DEVNULL,
                                             stderr=handle, close_fds=True)
        finally:
            theirs.close()
        self.sock = ours
        self._buffer = b""
        self.ready_at: float | None = None
        self.failure: str | None = None
        self.started_at = time.time()

    def alive(self) -> bool:
        """Whether the template still runs and has not reported a failure."""
        return self.failure is None and self.proc.poll() is None

    def _line(self, timeout: float) -> dict | None:
        """The next JSON line from the template, ``None`` if none came within ``timeout`` seconds.

        Raises:
            OSError: the template closed its socket.
        """
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([self.sock], [], [], max(0.0, left))
            if not readable:
                return None
            chunk = self.sock.recv(4096)
            if not chunk:
                raise OSError(f"the {self.role} template (pid {self.proc.pid}) went away; see {self.log}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def ready(self) -> bool:
        """Whether it finished its imports (reads its ready line without blocking); a failure it
        reported is kept in :attr:`failure`."""
        if self.ready_at is None and self.failure is None:
            try:
                doc = self._line(0.0)
            except OSError as err:
                self.failure = str(err)
                return False
            if doc is not None and doc.get("event") == "template_ready":
                self.ready_at = time.time()
            elif doc is not None:
                self.failure = str(doc.get("reason", doc))
            elif self.proc.poll() is not None:
                self.failure = f"the {self.role} template exited with {self.proc.returncode}; see {self.log}"
        return self.ready_at is not None and self.alive()

    def fork(self, fds: tuple[int, int, int]) -> int:
        """Fork a spare whose stdin, stdout and stderr are ``fds``; returns its pid (a child of this
        process). The caller closes its copies of ``fds``.

        Raises:
            OSError: the template is not ready, died, or did not answer within 30 s.
        """
        if not self.ready() or not self.alive():
            raise OSError(f"the {self.role} template is not ready ({self.failure or 'importing'})")
        socket.send_fds(self.sock, [b"fork"], list(fds))
        doc = self._line(_REPLY_SECONDS)
        if doc is None or not doc.get("pid"):
            self.failure = f"fork request answered {doc!r}"
            raise OSError(f"the {self.role} template could not fork a spare: {self.failure}")
        pid = int(doc["pid"])
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # ChildProcessError: not adopted
        return pid

    def stop(self) -> None:
        """End the template (EOF on its socket, then SIGKILL). Never raises."""
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedProcess(subprocess.Popen):
    """A :class:`subprocess.Popen` whose process is forked by ``template`` instead of executed.

    ``args`` is only its label; ``stdin``/``stdout``/``stderr`` are as for :class:`subprocess.Popen`
    (the pipes or files the spare protocol needs). Everything after the start — ``poll``, ``wait``,
    ``send_signal``, ``returncode``, ``pid`` — is Popen's own.

    Raises:
        OSError: the template could not fork (nothing was started).
    """

    def __init__(self, template: Template, args: list[str], **kwargs) -> None:
        self._template = template
        super().__init__(args, close_fds=True, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,  # noqa: PLR0913
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):
        null = os.open(os.devnull, os.O_RDWR)
        try:
            fds = tuple(fd if fd != -1 else null for fd in (p2cread, c2pwrite, errwrite))
            self.pid = self._template.fork(fds)  # type: ignore[arg-type]
            self._child_created = True
        finally:
            os.close(null)
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


def await_ready(templates: Iterable[Template], timeout: float) -> None:
    """Wait until every template is ready or has failed.

    Raises:
        ClusterError: one is still importing after ``timeout`` seconds.
    """
    pending = list(templates)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [t for t in pending if t.alive() and not t.ready()]
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"templates not ready within {timeout:.0f} s; see {pending[0].log}")
        if pending:
            time.sleep(0.05)
