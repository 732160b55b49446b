"""The *zygote* of ``bench crash``: imports torch and the savers once, then forks one victim per command.

Run as ``python -m lifeline.bench._crash_zygote CONFIG_JSON``. It never runs a torch op nor starts a
thread, so every fork is safe and starts in milliseconds instead of re-importing torch. Children are
reaped automatically (``SIGCHLD`` ignored); the bench awaits a victim's exit with a pidfd.

Commands on stdin, one per line:

* ``save STEP SEED HOLD`` — fork a saver that prints ``saving PID STEP``, saves ``STEP`` (state of
  ``SEED``) with the checkpoint library to the configured storage, prints ``saved STEP SECONDS``, then
  exits (``HOLD`` = 0) or waits to be killed (``HOLD`` = 1).
* ``sidecar RANK`` — fork a real sidecar (:class:`lifeline.sidecar.server.Sidecar`) for ``RANK`` with
  the configured settings; it prints ``sidecar RANK PID`` once started and serves until killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def _say(line: str) -> None:
    """Write ``line`` and its newline in one ``write`` (atomic on a pipe below PIPE_BUF bytes): with
    ``PYTHONUNBUFFERED=1`` ``print`` writes them separately, and a victim killed in between glued the
    next process's line to its unfinished one."""
    os.write(1, (line + "\n").encode())


def _storage(cfg: dict[str, Any]):
    from lifeline.checkpoint import FilesystemStorage, S3Storage

    if cfg["target"] == "fs":
        return FilesystemStorage(cfg["root"], fsync=True)
    s3 = cfg["s3"]
    return S3Storage(s3["endpoint"], s3["access_key"], s3["secret_key"], s3["bucket"], part_size=s3["part_size"],
                     max_concurrency=s3["concurrency"], retries=1, create_bucket=False)


def _saver(cfg: dict[str, Any], step: int, seed: int, hold: bool) -> None:
    import torch

    from lifeline.bench._crash_state import RULES, library_states
    from lifeline.checkpoint import Layout, save_states

    torch.set_num_threads(1)
    layout = Layout(tensor=cfg["tensor"], data=cfg["data"])
    storage = _storage(cfg)
    states = library_states(seed, cfg["rows"], layout)
    _say(f"saving {os.getpid()} {step}")
    t0 = time.perf_counter()
    save_states(storage, cfg["prefix"], cfg["job"], step, layout, RULES, states, block_size=64 << 10)
    _say(f"saved {step} {time.perf_counter() - t0:.6f}")
    if hold:
        signal.pause()


def _sidecar(cfg: dict[str, Any], rank: int) -> None:
    from lifeline.api.pod import SidecarSettings
    from lifeline.sidecar.server import Sidecar

    settings = SidecarSettings(**cfg["sidecars"][rank])
    Sidecar(settings).start()
    _say(f"sidecar {rank} {os.getpid()}")
    while True:
        signal.pause()


def main(cfg: dict[str, Any]) -> None:
    """Serve commands from stdin until EOF (see the module docstring)."""
    import torch  # noqa: F401 - imported once here, inherited by every fork

    if cfg["target"] == "sidecar":
        import lifeline.sidecar.server
    else:
        import lifeline.bench._crash_state  # noqa: F401
        _storage(cfg)  # imports the storage modules (no request is sent)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for line in sys.stdin:
        cmd, *args = line.split()
        pid = os.fork()
        if pid:
            continue
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = 1
        try:
            if cmd == "save":
                _saver(cfg, int(args[0]), int(args[1]), args[2] == "1")
                code = 0
            elif cmd == "sidecar":
                _sidecar(cfg, int(args[0]))
            else:
                _say(f"error unknown command {cmd!r}")
        except BaseException as err:  # noqa: BLE001 - reported to the bench, which fails the run
            _say(f"error {type(err).__name__}: {str(err)[:500]!r}".replace("\n", " "))
        finally:
            sys.stdout.flush()
            os._exit(code)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
