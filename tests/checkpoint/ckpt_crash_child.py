"""Child process for the crash test.

Started once as a *zygote* (imports torch, runs no torch op); for every line ``run <start>``
on stdin it forks a saver that saves steps ``start, start+1, ...`` until it is SIGKILLed,
and prints ``pid <pid>``. Forking from a process that never started a thread pool keeps
the saver safe and makes each trial start in milliseconds instead of re-importing torch.
"""

from __future__ import annotations

import os
import sys

import torch
from ckpt_models import build_model, states_for

from lifeline.checkpoint import FilesystemStorage, Layout, save_states

LAYOUT = Layout(tensor=2, data=2)


def model_for(step: int):
    return build_model(seed=step, t_lcm=2, e_lcm=1, hidden=64, vocab=1000, layers=2, dtype=torch.float32)


def _say(line: str) -> None:
    """Write ``line`` and its newline in one ``write`` (atomic on a pipe below PIPE_BUF bytes).

    ``print`` writes the text and the newline in two ``write`` calls when stdout is unbuffered
    (``PYTHONUNBUFFERED=1``, as on the CI machine): a saver killed between the two left ``saving 142``
    without its newline, the zygote's ``reaped`` was appended to it, and the test waited for a
    ``reaped`` line forever (CI of stop 38: 900 s, then pytest-timeout)."""
    os.write(1, (line + "\n").encode())


def saver(root: str, start: int) -> None:
    torch.set_num_threads(1)
    storage = FilesystemStorage(root, fsync=True)
    step = start
    while True:
        model = model_for(step)
        states = states_for(model, LAYOUT)
        _say(f"saving {step}")
        save_states(storage, "ck", "job", step, LAYOUT, model.rules, states, block_size=4096)
        _say(f"saved {step}")
        step += 1


if __name__ == "__main__":
    root = sys.argv[1]
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd != "run":
            break
        pid = os.fork()
        if pid == 0:
            try:
                saver(root, int(arg))
            finally:
                os._exit(1)
        _say(f"pid {pid}")
        os.waitpid(pid, 0)
        _say("reaped")
