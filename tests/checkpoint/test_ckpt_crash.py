"""Invariant 3 (no torn checkpoints): SIGKILL a saving process at random moments, many trials."""

from __future__ import annotations

import collections
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ckpt_crash_child import model_for
from ckpt_models import assert_states_equal

from lifeline.checkpoint import FilesystemStorage, consolidate, list_steps, verify_checkpoint

HERE = Path(__file__).parent


def _states(pid: int) -> str:
    """``pid`` and its children: state, kernel wait channel and stack (what a stuck wait waits on)."""
    out = []
    for p in [pid] + [int(c) for t in Path(f"/proc/{pid}/task").glob("*") for c in (t / "children").read_text().split()]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{p}/wchan").read_text()
            stack = " | ".join(Path(f"/proc/{p}/stack").read_text().split("\n")[:6]) if os.geteuid() == 0 else ""
            out.append(f"{p} {stat} {wchan} {stack}")
        except OSError as err:
            out.append(f"{p}: {err}")
    return "; ".join(out)


class _Lines:
    """The zygote's stdout lines through a reader thread, so that every wait has a deadline (a
    blocking ``readline`` waited 900 s in CI for a ``reaped`` line that had been glued to a killed
    saver's unfinished line: see ``ckpt_crash_child._say``), and a failure shows the last lines."""

    def __init__(self, proc: subprocess.Popen, errors: Path):
        self.proc, self.errors, self.queue = proc, errors, queue.Queue()
        self.seen: collections.deque[str] = collections.deque(maxlen=40)  # what the last failure shows
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in self.proc.stdout:
                self.seen.append(f"{time.monotonic():.3f} {line.strip()}")
                self.queue.put(line)
        finally:
            self.seen.append(f"{time.monotonic():.3f} EOF")
            self.queue.put("")  # EOF (or the reader failed: the error is in the thread's traceback)

    def next(self, deadline_s: float) -> str:
        """The next line ("" at EOF). Raises AssertionError naming the zygote's state after ``deadline_s``."""
        try:
            return self.queue.get(timeout=deadline_s)
        except queue.Empty:
            raise AssertionError(f"no line from the zygote within {deadline_s}s (now {time.monotonic():.3f}); "
                                 f"processes: {_states(self.proc.pid)}; last lines: {list(self.seen)}; "
                                 f"stderr: {self.errors.read_text()[-4000:]}") from None

    def wait_for(self, prefix: str, deadline_s: float) -> str:
        """The next line starting with ``prefix``. A saver that exits before it was killed ("reaped"
        while waiting for another line) fails the test with the zygote's stderr."""
        deadline = time.monotonic() + deadline_s
        while True:
            line = self.next(max(0.0, deadline - time.monotonic()))
            if not line:  # EOF: the child is gone
                self.proc.wait(timeout=30)
                raise AssertionError(f"child exited with {self.proc.returncode}: {self.errors.read_text()[-4000:]}")
            if line.startswith(prefix):
                return line
            if line.startswith("reaped"):
                raise AssertionError(f"the saver exited before it was killed: {self.errors.read_text()[-4000:]}")


def test_sigkill_during_saves_never_exposes_a_torn_checkpoint(tmp_path):
    rng = random.Random(1234)
    storage = FilesystemStorage(tmp_path / "root", fsync=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    errors = tmp_path / "zygote.err"
    zygote = subprocess.Popen([sys.executable, str(HERE / "ckpt_crash_child.py"), str(tmp_path / "root")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors.open("w"), text=True,
                              env=env)
    lines = _Lines(zygote, errors)
    committed: list[int] = []
    killed_mid_save = 0
    try:
        for trial in range(40):
            start = (committed[-1] + 1) if committed else 1
            zygote.stdin.write(f"run {start}\n")
            zygote.stdin.flush()
            pid = int(lines.wait_for("pid", 120).split()[1])
            lines.wait_for("saving", 60)
            time.sleep(rng.uniform(0.0, 0.3))  # the random moment of the crash is the point of the test
            os.kill(pid, signal.SIGKILL)
            last = ""
            while True:
                line = lines.next(120)  # a SIGKILLed saver is reaped at once; 120 s is for a loaded machine
                assert line, f"the zygote exited: {errors.read_text()[-4000:]}"
                if line.startswith("reaped"):
                    break
                last = line
            killed_mid_save += last.startswith("saving")
            steps = list_steps(storage, "ck", "job")
            assert steps[: len(committed)] == committed, "a committed step disappeared"
            for step in steps[len(committed):] + committed[-1:]:
                verify_checkpoint(storage, "ck", "job", step)
                assert_states_equal(consolidate(storage, "ck", "job", step), model_for(step).full)
            committed = steps
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait()
    assert committed, "no save ever committed"
    assert killed_mid_save >= 10, f"only {killed_mid_save} kills landed inside a save"
