"""Invariant 3 (no torn checkpoints): SIGKILL a saving process at random moments, many trials."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from ckpt_crash_child import model_for
from ckpt_models import assert_states_equal

from lifeline.checkpoint import FilesystemStorage, consolidate, list_steps, verify_checkpoint

HERE = Path(__file__).parent


def _wait_for_line(proc: subprocess.Popen, prefix: str, deadline_s: float, errors: Path) -> str:
    """The next line of the zygote's stdout starting with ``prefix``. A saver that exits before it was
    killed ("reaped" while waiting for another line) fails the test with the zygote's stderr."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:  # EOF: the child is gone
            proc.wait(timeout=30)
            raise AssertionError(f"child exited with {proc.returncode}: {errors.read_text()[-4000:]}")
        if line.startswith(prefix):
            return line
        if line.startswith("reaped"):
            raise AssertionError(f"the saver exited before it was killed: {errors.read_text()[-4000:]}")
    raise AssertionError(f"no {prefix!r} line within {deadline_s}s")


def test_sigkill_during_saves_never_exposes_a_torn_checkpoint(tmp_path):
    rng = random.Random(1234)
    storage = FilesystemStorage(tmp_path / "root", fsync=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    errors = tmp_path / "zygote.err"
    zygote = subprocess.Popen([sys.executable, str(HERE / "ckpt_crash_child.py"), str(tmp_path / "root")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors.open("w"), text=True,
                              env=env)
    committed: list[int] = []
    killed_mid_save = 0
    try:
        for trial in range(40):
            start = (committed[-1] + 1) if committed else 1
            zygote.stdin.write(f"run {start}\n")
            zygote.stdin.flush()
            pid = int(_wait_for_line(zygote, "pid", 120, errors).split()[1])
            _wait_for_line(zygote, "saving", 60, errors)
            time.sleep(rng.uniform(0.0, 0.3))  # the random moment of the crash is the point of the test
            os.kill(pid, signal.SIGKILL)
            last = ""
            while True:
                line = zygote.stdout.readline()
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
