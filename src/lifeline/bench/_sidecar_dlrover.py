"""The sidecar bench's DLRover peer: DLRover's flash checkpoint to memory, in a subprocess stepped one
save at a time (``save_checkpoint(..., StorageType.MEMORY)``); the reason is recorded when it cannot run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from lifeline.bench._sidecar_peers import wait

__all__ = ["DLRover"]

_DLROVER = textwrap.dedent("""
    import os, sys, time, torch
    import torch.distributed as dist
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType
    nbytes, workdir, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    n = nbytes // 4 // 8
    state = {f"layers.{i}.weight": torch.empty(n).uniform_(generator=g) for i in range(8)}
    ck = DdpCheckpointer(workdir)
    step = 0
    while True:  # one save per line on stdin (the first is the warm-up), its stall printed
        t0 = time.perf_counter()
        ck.save_checkpoint(step, state, os.path.join(workdir, f"ckpt-{step}.pt"), storage_type=StorageType.MEMORY)
        print(f"DLROVER_SAVE {time.perf_counter() - t0!r}", flush=True)
        step += 1
        if not sys.stdin.readline():
            os._exit(0)
""")


class DLRover:
    """DLRover's flash checkpoint to memory in a subprocess, one save per call (so that it interleaves
    with the sidecar's saves). Standalone (no ``dlrover-run`` agent) its engine forks a saver process
    and connects to it at once, which can race (connection refused): the warm-up save is tried in up
    to 3 fresh processes. ``why`` says why it cannot run (then calls return None).

    Args:
        nbytes: the state's size in bytes (8 float32 tensors, as the bench's state).
        workdir: directory for its logs and checkpoints.

    Attributes:
        why: why it does not run ('' when it does); ``attempts``: processes tried;
        first_s: the warm-up save's stall in seconds (None when it never saved); ``log``: the last try's log.
    """

    def __init__(self, nbytes: int, workdir: Path) -> None:
        self.p: subprocess.Popen | None = None
        self.why = ""
        self.attempts = 0
        self.first_s: float | None = None
        self.before = {p.name for p in Path("/dev/shm").glob("ckpt_shm_*")}
        try:  # an optional dependency: without it the row records why it did not run
            import dlrover  # noqa: F401
        except ImportError:
            self.why = "dlrover is not installed (pip install dlrover into the venv for this bench)"
            return
        for attempt in range(3):
            self.attempts = attempt + 1
            self.log = workdir / f"dlrover-try{attempt}.log"
            (workdir / f"dlrover-try{attempt}").mkdir(parents=True, exist_ok=True)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = dict(os.environ, LOCAL_RANK="0", RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", NODE_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            with open(self.log, "w") as fh:
                self.p = subprocess.Popen(
                    [sys.executable, "-c", _DLROVER, str(nbytes), str(workdir / f"dlrover-try{attempt}"), str(port)],
                    stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                    text=True)
            first = self._next(0)
            if first is not None:
                self.first_s = first
                return
            self.why = f"exit {self.p.returncode}: {self.log.read_text(errors='replace')[-1500:]}"
            self._kill()

    def _saves(self) -> list[float]:
        return [float(line.split()[1]) for line in self.log.read_text(errors="replace").splitlines()
                if line.startswith("DLROVER_SAVE ")]

    def _next(self, done: int) -> float | None:
        try:
            wait(lambda: self.p.poll() is not None or len(self._saves()) > done, 600, "DLRover flash checkpoint")
        except TimeoutError:
            return None
        saves = self._saves()
        return saves[done] if len(saves) > done else None

    @property
    def ran(self) -> bool:
        """Whether its warm-up save succeeded."""
        return self.first_s is not None

    def __call__(self) -> float | None:
        """One more save; its stall in seconds (None when DLRover does not run)."""
        if not self.ran or self.p is None or self.p.poll() is not None:
            return None
        done = len(self._saves())
        try:
            self.p.stdin.write("save\n")
            self.p.stdin.flush()
        except OSError:
            return None
        return self._next(done)

    def _kill(self) -> None:
        if self.p is not None:
            try:  # DLRover forks a saver process that outlives the trainer: kill the whole group
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
            self.p = None
        for shm in Path("/dev/shm").glob("ckpt_shm_*"):  # DLRover's shared memory outlives its killed saver
            if shm.name not in self.before:
                shm.unlink(missing_ok=True)

    def close(self) -> None:
        """Kill its process group and remove the shared memory it left."""
        self._kill()
