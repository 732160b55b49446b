"""Helpers of the command-line tests: run the real CLI of the source under test, as a subprocess
(:func:`run_cli`) or in this process (:func:`run_cli_here`).

``SRC`` is the ``src`` directory next to ``tests/`` (computed from this file), so the subprocess runs
the code of this checkout whatever is installed in the interpreter; :func:`run_cli_here` checks that
the ``lifeline`` imported here is that same code.

:func:`run_cli_here` calls :func:`lifeline.cli.main`, the function ``python -m lifeline`` calls, as a
fresh process would: ``sys.argv``, the working directory and the environment (the same one
:func:`run_cli` gives its subprocess, marker included) are set for the call; ``sys.stdout`` and
``sys.stderr`` are ``StringIO`` objects and file descriptors 1 and 2 temporary files (so output
written by C code or inherited by a child is captured too); ``sys.stdin`` is empty; the root logger
has no handlers (a record reaches stderr through :data:`logging.lastResort`, as in a fresh process,
not pytest's log capture) and warnings print to stderr with the interpreter's default filters.
``SystemExit`` gives the exit code as the interpreter would; any other exception escaping ``main``
becomes a traceback on stderr and exit 1. Everything is restored afterwards, on failure too:
environment, working directory, ``sys.argv``, standard streams and descriptors, logging (handlers,
levels of every logger, ``logging.disable``), warning filters and every Python signal handler.

An in-process run may not start a process at all: while it runs, an audit hook makes
``subprocess.Popen``, ``os.fork``, ``os.posix_spawn``, ``os.exec*``, ``os.system`` and the like raise,
and the run fails (``AssertionError``) if one was attempted, so a command that wrongly gets past its
checks starts no service inside pytest. Child processes are still looked for afterwards, as
:func:`run_cli` does (new children of this process, and any process carrying the run's marker), and
reported in ``Result.leftovers``; a thread the run left alive fails the run as well.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

SRC = Path(__file__).resolve().parents[2] / "src"
MARKER = "LIFELINE_TEST_MARKER"
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec",
                             "os.spawn", "os.system", "os.startfile", "pty.spawn"})


@dataclass
class Result:
    """A finished CLI run: exit code, output and the processes it left behind (pids)."""

    returncode: int
    stdout: str
    stderr: str
    leftovers: list[int]


def _tagged(tag: str) -> list[int]:
    """Pids of live processes (other than this one) whose environment carries ``MARKER=tag``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == tag:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _environ(env: dict[str, str] | None, drop_env: tuple[str, ...], tag: str) -> dict[str, str]:
    """The environment of a run: this one less ``drop_env``, ``COLUMNS=200``, ``env``, source and marker."""
    full = {k: v for k, v in os.environ.items() if k not in drop_env}
    full.update({"COLUMNS": "200", **(env or {})})
    full.update({"PYTHONPATH": str(SRC), MARKER: tag})
    return full


def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
            drop_env: tuple[str, ...] = ()) -> Result:
    """Run ``python -m lifeline ARGS`` in ``cwd``; kill (and report) any process it left running."""
    tag = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "lifeline", *args], cwd=cwd, env=_environ(env, drop_env, tag),
                          capture_output=True, text=True, timeout=timeout, check=False)
    left = _tagged(tag)
    _kill(left)
    return Result(proc.returncode, proc.stdout, proc.stderr, left)


# --- in process ----------------------------------------------------------------------------------------

_attempts: list[str] | None = None  # process starts attempted by the in-process run under way, else None
_hooked = False


def _audit(event: str, args: tuple) -> None:
    if _attempts is not None and event in _PROCESS_EVENTS:
        _attempts.append(f"{event}{args!r:.200}")
        raise RuntimeError(f"tests/cli/_cli.py: an in-process CLI run may start no process ({event})")


def _install_hook() -> None:
    global _hooked
    if not _hooked:  # an audit hook cannot be removed: one, idle outside runs
        sys.addaudithook(_audit)
        _hooked = True


@contextlib.contextmanager
def _environment(full: dict[str, str]) -> Iterator[None]:
    """``os.environ`` is ``full`` inside; restored exactly (changes made inside included) after."""
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k not in full]:
            del os.environ[key]
        os.environ.update(full)
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def _cwd_and_argv(cwd: Path, argv: list[str]) -> Iterator[None]:
    old_cwd, old_argv = os.getcwd(), sys.argv
    os.chdir(cwd)
    sys.argv = [str(SRC / "lifeline" / "__main__.py"), *argv]  # as `python -m lifeline` sets it
    try:
        yield
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)


@contextlib.contextmanager
def _fresh_logging() -> Iterator[None]:
    """The root logger as in a fresh process (no handlers, WARNING); every logger that existed before
    restored after (level, handlers, propagation; a logger first created inside, by an import, is kept
    as the import made it)."""
    manager = logging.Logger.manager
    loggers = [logging.root, *(lg for lg in list(manager.loggerDict.values()) if isinstance(lg, logging.Logger))]
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers]
    disabled = logging.root.manager.disable
    logging.root.handlers = []
    logging.root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        for handler in logging.root.handlers:  # e.g. basicConfig's: it holds the captured stream
            if all(handler not in s[2] for s in saved):
                handler.close()
        for lg, level, handlers, propagate, was_disabled in saved:
            lg.handlers, lg.propagate, lg.disabled = handlers, propagate, was_disabled
            lg.setLevel(level)
        logging.disable(disabled)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """Every Python-level signal handler as before, after."""
    saved = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(ValueError, OSError):
            handler = signal.getsignal(sig)
            if handler is not None:
                saved[sig] = handler
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


@contextlib.contextmanager
def _captured_fds() -> Iterator[tuple[io.StringIO, io.StringIO, list[str]]]:
    """Capture ``sys.stdout``/``sys.stderr`` (``StringIO``) and descriptors 1 and 2 (temporary files).

    Yields (out, err, fd_text): ``fd_text`` is filled, after the block, with what was written to the
    descriptors 1 and 2 (below the Python streams)."""
    out, err, fd_text = io.StringIO(), io.StringIO(), ["", ""]
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    old_stdin = sys.stdin
    with tempfile.TemporaryFile() as fd1, tempfile.TemporaryFile() as fd2:
        try:
            os.dup2(fd1.fileno(), 1)
            os.dup2(fd2.fileno(), 2)
            sys.stdin = io.StringIO("")
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield out, err, fd_text
        finally:
            sys.stdin = old_stdin
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            for i, f in enumerate((fd1, fd2)):
                f.seek(0)
                fd_text[i] = f.read().decode("utf-8", "replace")


def _exit_code(exc: SystemExit, err: io.StringIO) -> int:
    """The status the interpreter exits with for ``exc`` (a non-integer code is printed, status 1)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=err)
    return 1


def _check_source() -> None:
    import lifeline

    where = Path(lifeline.__file__).resolve()
    if SRC not in where.parents:
        raise RuntimeError(f"tests/cli: lifeline is imported from {where}, not this checkout's {SRC}")


def run_cli_here(args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
                 drop_env: tuple[str, ...] = ()) -> Result:
    """Run ``lifeline ARGS`` in this process, as :func:`run_cli` runs it in a subprocess (module docstring).

    Raises ``AssertionError`` if the run tried to start a process or left a thread alive; kills (and
    reports) any process it left running."""
    global _attempts
    _check_source()
    from lifeline.cli import main

    _install_hook()
    tag = uuid.uuid4().hex
    me = psutil.Process()
    children = {p.pid for p in me.children(recursive=True)}
    threads = set(threading.enumerate())
    attempts: list[str] = []
    code = 1
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(_environ(env, drop_env, tag)))
        stack.enter_context(_cwd_and_argv(cwd, list(args)))
        stack.enter_context(_signals())
        stack.enter_context(_fresh_logging())
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.resetwarnings()
        for action, category in (("default", DeprecationWarning), ("ignore", DeprecationWarning),
                                 ("ignore", PendingDeprecationWarning), ("ignore", ImportWarning),
                                 ("ignore", ResourceWarning)):  # the interpreter's default filters
            warnings.filterwarnings(action, category=category, module="__main__" if action == "default" else "",
                                    append=True)
        out, err, fd_text = stack.enter_context(_captured_fds())
        _attempts = attempts
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc, err)
        except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
            traceback.print_exc(file=err)
            code = 1
        finally:
            _attempts = None
        for w in caught:
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    stdout, stderr = out.getvalue() + fd_text[0], err.getvalue() + fd_text[1]
    left = sorted({p.pid for p in me.children(recursive=True)} - children | set(_tagged(tag)))
    _kill(left)
    new_threads = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    for t in new_threads:
        t.join(timeout=2)
    alive = [t.name for t in new_threads if t.is_alive()]
    assert not attempts, f"the in-process run tried to start a process: {attempts}\n{stderr}"
    assert not alive, f"the in-process run left threads running: {alive}\n{stderr}"
    return Result(code, stdout, stderr, left)


def snapshot(root: Path) -> set[str]:
    """Every path under ``root`` (relative), to compare before and after a run."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}
