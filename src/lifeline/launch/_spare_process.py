"""The spare process: import the heavy modules now, take a container's command later.

``python -m lifeline.launch._spare_process MODULE [MODULE ...]`` imports each ``MODULE`` (torch, the
runtime, the model; a module that fails to import is reported on stderr and skipped), warms
torch's autograd with one tiny backward pass, writes ``ready`` on stdout and blocks on stdin for
one assignment — a JSON line::

    {"argv": ["/usr/bin/python3", "-m", "lifeline", "trainer"], "env": {...}, "log": "/path/to/log"}

It then becomes that container: stdout and stderr are appended to ``log``, stdin is
``/dev/null``, ``os.environ`` is replaced by ``env`` (exactly the environment a fresh process
would get, so the ``LIFELINE_*`` contract is unchanged) and ``argv`` runs in this interpreter
(``python -m MODULE ...`` through :func:`runpy.run_module`, ``python FILE ...`` through
:func:`runpy.run_path`); any other command is ``exec``'d as it is. EOF on stdin (the launcher
went away) exits 0. A spare assigned while still importing (the pool hands out a warming one
when no ready one exists) finds the launcher's end of stdout closed: it skips the ``ready``
line and takes the assignment.

No thread pool or process group is created before the assignment, so the process is in the
state a fresh one would be in after its imports. A spare forked from a template
(:mod:`lifeline.launch._template`) skips the imports and starts at :func:`serve`.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path

__all__ = ["main", "serve", "preload"]


def preload(modules: list[str]) -> float:
    """Import ``modules`` (a failure is reported on stderr and skipped) and warm autograd; returns the seconds taken."""
    start = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a spare of a foreign image still works, just colder
            print(f"spare: preloading {name} failed ({type(err).__name__}: {err}); it loads on assignment",
                  file=sys.stderr, flush=True)
    if "torch" in sys.modules:  # first-use costs of autograd (engine, allocator) paid now, not after a failure
        import torch

        x = torch.ones(4, 4, requires_grad=True)
        (x @ x).sum().backward()
    return time.perf_counter() - start


def _redirect(log: str) -> None:
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _run(argv: list[str], env: dict[str, str]) -> None:
    """Run ``argv`` in this interpreter when it is a Python command, else exec it."""
    exe, rest = argv[0], argv[1:]
    python = os.path.realpath(exe) == os.path.realpath(sys.executable) or Path(exe).name.startswith("python")
    if python and len(rest) >= 2 and rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    elif python and rest and not rest[0].startswith("-"):
        sys.argv = list(rest)
        runpy.run_path(rest[0], run_name="__main__")
    else:
        os.execvpe(exe, argv, env)


def main(modules: list[str]) -> None:
    """Preload ``modules``, report ``ready``, wait for the assignment and run it (see the module docstring)."""
    serve(preload(modules))


def serve(seconds: float) -> None:
    """Report ``ready`` (after ``seconds`` of imports) on stdout, wait for the assignment on stdin and
    run it. Also the entry of a spare forked from a template (:mod:`lifeline.launch._template`)."""
    ready = json.dumps({"event": "spare_ready", "pid": os.getpid(), "seconds": round(seconds, 3)}) + "\n"
    try:  # unbuffered: nothing of it may linger in sys.stdout's buffer for the container's log
        os.write(1, ready.encode())
    except BrokenPipeError:
        pass  # assigned while still importing: the launcher closed its end; the assignment is on stdin
    line = sys.stdin.readline()
    if not line.strip():
        sys.exit(0)
    assignment = json.loads(line)
    received = time.time()
    _redirect(assignment["log"])
    env = {str(k): str(v) for k, v in assignment["env"].items()}
    os.environ.clear()
    os.environ.update(env)
    print(json.dumps({"event": "spare_assigned", "pid": os.getpid(), "time": round(received, 3)}), flush=True)
    _run([str(a) for a in assignment["argv"]], env)


if __name__ == "__main__":
    main(sys.argv[1:])
