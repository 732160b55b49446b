"""A recorded pid that names another process by now is never signalled (lifeline.devcluster.ProcessRef).

A pid number is reused once its process is gone (pid_max is often 32768): a stale record read back
later names a stranger with the same number and another start time. The tests build that record
deterministically — the stranger's own pid with a start time that is not its own — instead of
waiting for the kernel to wrap around.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from lifeline.devcluster import ProcessRef
from lifeline.devcluster._nodes import pod_process_groups
from lifeline.devcluster._proc import kill_group, stop_group, wait_until


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def stranger():
    """A process that leads its own group (as a container does), killed at the end."""
    p = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_a_ref_round_trips_through_its_text_and_reads_the_start_time(stranger):
    ref = ProcessRef.of(stranger.pid)
    assert ref.start is not None and ref.alive()
    assert ProcessRef.parse(str(ref)) == ref
    assert ProcessRef.parse(f"{stranger.pid}\n") == ProcessRef(stranger.pid, None)
    with pytest.raises(ValueError):
        ProcessRef.parse("1 2 3")


def test_a_stale_ref_neither_stops_nor_kills_the_process_that_has_its_pid_now(stranger):
    stale = ProcessRef(stranger.pid, ProcessRef.of(stranger.pid).start - 1)
    assert not stale.alive()
    assert stale.signal(signal.SIGSTOP) is False
    assert stale.signal_group(signal.SIGKILL) is False
    kill_group(stale, signal.SIGKILL)
    stop_group(stale, grace=0.1)
    assert stranger.poll() is None and _state(stranger.pid) in ("S", "R")


def test_a_current_ref_stops_continues_and_kills_its_process(stranger):
    ref = ProcessRef.of(stranger.pid)
    assert ref.signal(signal.SIGSTOP)
    wait_until(ref.stopped, timeout=10, what="the process stopped")  # a stop lands asynchronously
    assert ref.signal(signal.SIGCONT)
    stop_group(ref, grace=5)
    assert stranger.wait(timeout=10) == -signal.SIGTERM
    assert not ref.alive() and ref.signal(signal.SIGKILL) is False


def test_stale_pid_files_of_a_lost_node_spare_strangers(tmp_path, stranger):
    """What ``kill_node`` and a restarted node agent read: pid files left behind by containers that
    are gone. One names the stranger's pid with another start time."""
    d = tmp_path / "pods" / "uid-1" / "containers"
    d.mkdir(parents=True)
    (d / "trainer.pid").write_text(str(ProcessRef(stranger.pid, ProcessRef.of(stranger.pid).start + 7)))
    (d / "sidecar.pid").write_text("not a pid")
    groups = pod_process_groups(tmp_path)
    assert groups == [ProcessRef(stranger.pid, ProcessRef.of(stranger.pid).start + 7)]
    for g in groups:
        kill_group(g, signal.SIGKILL)
    assert stranger.poll() is None
