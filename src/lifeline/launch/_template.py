"""The template process: import the heavy modules once, fork a spare per request.

``python -m lifeline.launch._template MODULE [MODULE ...]`` is started by
:class:`lifeline.launch.templates.Template` with a Unix socket to the launcher on its stdin. It
imports each ``MODULE`` as a spare would (:func:`lifeline.launch._spare_process.preload`), checks that it
is still single-threaded (a fork copies only the calling thread: a thread pool's other threads
would be gone in the child with their locks held), and writes one JSON line on the socket::

    {"event": "template_ready", "pid": 123, "seconds": 4.1}

or ``{"event": "template_failed", "reason": ...}`` and exits 3. It then serves requests: each is
one message ``fork`` carrying three file descriptors (the new spare's stdin, stdout and stderr,
passed with ``SCM_RIGHTS``). It forks twice — the middle process exits at once — so the spare is
orphaned and adopted by the launcher, which made itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``): the spare is the launcher's own child, with its exit status and
signals, exactly as a spare the launcher started itself. The reply, sent once the middle process
has been reaped (so the adoption has happened), is ``{"pid": N}``. The spare continues in
:func:`lifeline.launch._spare_process.serve` with the descriptors as its stdin, stdout and stderr: it is
a spare that has paid its imports in a few milliseconds (copy-on-write pages) instead of seconds.

EOF on the socket (the launcher went away) ends the template with exit 0.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from lifeline.launch._spare_process import preload, serve

__all__ = ["main"]


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no procfs: trust the check the caller made (OMP_NUM_THREADS=1)
        return 1


def _send(sock: socket.socket, doc: dict) -> None:
    sock.sendall((json.dumps(doc) + "\n").encode())


def _fork_spare(fds: list[int]) -> int | None:
    """Fork a spare on ``fds`` (stdin, stdout, stderr). Returns its pid in the template, ``None``
    in the spare itself (which must then go on to :func:`serve`)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            child = os.fork()
        except BaseException:  # noqa: BLE001 - nothing of the template may run on in this process
            os._exit(1)
        if child == 0:
            os.close(read_end)
            os.close(write_end)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            return None
        try:
            os.write(write_end, str(child).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        raw = os.read(read_end, 32)
    finally:
        os.close(read_end)
    os.waitpid(middle, 0)  # reaped: the spare is orphaned, and so adopted by the launcher now
    return int(raw) if raw else 0


def main(modules: list[str]) -> int:
    """Preload ``modules`` and serve fork requests on the socket at stdin (see the module docstring).

    Returns:
        The exit code in the template (0 on EOF, 3 when it cannot fork safely); in a forked spare
        it does not return (the spare runs its assignment and exits with its code).
    """
    sock = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    seconds = preload(modules)
    threads = _threads()
    if threads != 1:
        _send(sock, {"event": "template_failed",
                     "reason": f"{threads} threads after the imports; a fork copies only one (is OMP_NUM_THREADS=1?)"})
        return 3
    _send(sock, {"event": "template_ready", "pid": os.getpid(), "seconds": round(seconds, 3)})
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 3)
        except ConnectionError:
            return 0
        if not msg:
            return 0
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            _send(sock, {"pid": 0, "error": f"a fork request carries 3 descriptors, got {len(fds)}"})
            continue
        pid = _fork_spare(fds)
        if pid is None:  # the spare: leave the template's loop and socket behind
            sock.close()
            serve(seconds)
            return 0
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
