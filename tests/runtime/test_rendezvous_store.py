"""A rank whose generation's rendezvous store dies (its host, rank 0, was killed) waits for the newer plan
the controller makes for that death, instead of exiting with an error of its own (fuzz seed 606: its
exit 2 was a second failure, answered by a third plan although nothing else had failed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from lifeline.api import LayoutSpec, RecoveryPlan
from lifeline.api.pod import TrainerSettings
from lifeline.catalog import Catalog
from lifeline.checkpoint import Layout
from lifeline.errors import RecoveryError
from lifeline.runtime import Superseded
from lifeline.runtime._context import RuntimeContext

from ._harness import SECRET, job_name

_HOST = """
import sys
import torch.distributed as dist
from datetime import timedelta
store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()  # serve until the test kills this process (or closes the pipe)
"""


@pytest.fixture
def dead_store():
    """A generation-1 store whose host process (rank 0's, as in a job) is SIGKILLed after rank 1 arrived."""
    host = subprocess.Popen([sys.executable, "-c", _HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=5))
        prefixed = dist.PrefixStore("lifeline/j/gen/1", store)
        prefixed.add("joined", 1)  # rank 1 is counted in; rank 0 is about to die
        os.kill(host.pid, signal.SIGKILL)
        host.wait(timeout=10)
        yield prefixed
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


def _context(redis_url: str, job: str, recovery_timeout: float) -> RuntimeContext:
    settings = TrainerSettings(job=job, rank=1, world_size=2, secret=SECRET, redis_url=redis_url,
                               recovery_timeout_seconds=recovery_timeout)
    return RuntimeContext(settings=settings, layout=Layout(data=2), rank=1, world_size=2, generation=1,
                          backend="gloo", catalog=Catalog(redis_url, job, 2))


def test_a_dead_store_waits_for_the_plan_answering_its_host(redis_server, dead_store):
    ctx = _context(redis_server.url, job_name("store"), recovery_timeout=60)
    answer = threading.Timer(0.5, ctx.catalog.put_plan, (RecoveryPlan.restore_all(2, None, LayoutSpec(data=2)),))
    answer.start()
    try:
        with pytest.raises(Superseded) as sup:
            ctx._await_members(dead_store, 1)
    finally:
        answer.cancel()
        ctx.catalog.close()
    assert sup.value.generation == 2


def test_a_dead_store_with_no_plan_coming_is_a_recovery_error(redis_server, dead_store):
    ctx = _context(redis_server.url, job_name("store"), recovery_timeout=1)
    try:
        with pytest.raises(RecoveryError, match="no newer plan came within 1 s"):
            ctx._await_members(dead_store, 1)
    finally:
        ctx.catalog.close()


def test_a_process_group_whose_peer_never_connects_waits_for_the_plan_answering_that_peer(redis_server):
    """The fresh rank of fuzz seed 606 after the template change: its generation's store was fine,
    but the peer it meshed with was killed during the recovery; ``init_process_group`` failed and
    the rank exited 1, a second failure. It must wait for the plan that answers its peer instead."""
    job = job_name("mesh")
    settings = TrainerSettings(job=job, rank=1, world_size=2, secret=SECRET, redis_url=redis_server.url,
                               recovery_timeout_seconds=60, collective_timeout_seconds=1)
    ctx = RuntimeContext(settings=settings, layout=Layout(data=2), rank=1, world_size=2, generation=1,
                         backend="gloo", catalog=Catalog(redis_server.url, job, 2))
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    answer = threading.Timer(0.5, ctx.catalog.put_plan, (RecoveryPlan.restore_all(2, None, LayoutSpec(data=2)),))
    answer.start()
    try:
        with pytest.raises(Superseded) as sup:  # rank 0 never puts its address: the mesh times out
            ctx._init_group(dist.PrefixStore(f"lifeline/{job}/gen/1", store), 1)
    finally:
        answer.cancel()
        ctx.catalog.close()
    assert sup.value.generation == 2 and not dist.is_initialized()
