"""The recovery beat (runtime/_beat.py) on a real Redis: a thread records ``beats[rank]`` every second
while the trainer starts or recovers, stops while it trains, survives Redis errors, and a frozen
process (SIGSTOP) stops beating — what the engine's hang rule during a recovery reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lifeline._poll import wait_for
from lifeline.catalog import Catalog
from lifeline.errors import CatalogError
from lifeline.runtime._beat import RecoveryBeat

from ._harness import job_name


def test_beats_go_to_the_catalog_every_interval_while_on_only(redis_server):
    catalog = Catalog(redis_server.url, job_name("beat"), 2)
    calls: list[float] = []

    def beat() -> None:
        calls.append(time.time())
        catalog.beat(1)

    b = RecoveryBeat(beat, interval=0.05)
    assert catalog.beats() == {}
    b.on = True
    first = wait_for(lambda: catalog.beats().get(1), 10, "a first beat")
    wait_for(lambda: catalog.beats().get(1, 0) > first, 10, "a newer beat")
    b.on = False
    n = len(calls)
    # while off, the thread waits on its condition: switching on again beats at once
    b.on = True
    wait_for(lambda: len(calls) > n + 1, 10, "beats again")
    b.close()
    b._thread.join(5)
    assert not b._thread.is_alive()


def test_a_catalog_error_does_not_stop_the_beat():
    calls = []

    def beat() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise CatalogError("redis away", job="j", rank=0)

    b = RecoveryBeat(beat, interval=0.01)
    b.on = True
    wait_for(lambda: len(calls) >= 3, 10, "beats after an error")
    b.close()


_FROZEN = """
import sys, threading
from lifeline.catalog import Catalog
from lifeline.runtime._beat import RecoveryBeat
c = Catalog(sys.argv[1], sys.argv[2], 1)
b = RecoveryBeat(lambda: c.beat(0), interval=0.05)
b.on = True
print("beating", flush=True)
threading.Event().wait()  # alive until the test kills it
"""


@pytest.mark.timeout(60)
def test_a_stopped_process_stops_beating(redis_server):
    job = job_name("frozen")
    catalog = Catalog(redis_server.url, job, 1)
    proc = subprocess.Popen([sys.executable, "-c", _FROZEN, redis_server.url, job], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "beating"
        wait_for(lambda: catalog.beats().get(0), 20, "the child's first beat")
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.time()
        last = catalog.beats()[0]
        with pytest.raises(TimeoutError):  # 40 beat intervals: none comes from a frozen process
            wait_for(lambda: catalog.beats()[0] > max(last, stopped + 0.1), 2.0, "a beat from the frozen child")
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: catalog.beats()[0] > stopped + 0.1, 20, "beats again after SIGCONT")
    finally:
        proc.kill()
        proc.wait()
