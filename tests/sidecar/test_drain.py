"""A sidecar that gets SIGTERM with its pod (``LIFELINE_PREEMPT_GRACE_SECONDS`` set) keeps serving its
preempted trainer until it left (lifeline.sidecar._drain): real sidecar and trainer processes, real Redis.

On Kubernetes both containers of a deleted pod get SIGTERM at once; these tests send it to both (the
sidecar first, the worst order) or to the sidecar alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import sidecar_argv, sidecar_env, trainer_argv, wait_for

from lifeline.catalog import Catalog


def _events(proc, event: str) -> list[dict]:
    out = []
    for ln in proc.output().splitlines():
        if ln.startswith("{") and '"level"' in ln:
            rec = json.loads(ln)
            if rec.get("event") == event:
                out.append(rec)
    return out


def _last_json(proc) -> dict:
    lines = [ln for ln in proc.output().splitlines() if ln.startswith("{") and '"level"' not in ln]
    return json.loads(lines[-1])


def _exit_time(proc, timeout: float) -> float:
    """Wait for ``proc`` and return when it exited (``time.monotonic``)."""
    try:
        proc.p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s; log:\n{proc.output()[-3000:]}")
    return time.monotonic()


def _two_ranks(make_settings, sidecars, procs, job, redis_server, grace: float):
    """Rank 0 (sidecar and a ``preempt`` trainer, processes) whose step 1 reached rank 1's sidecar (L1)."""
    s0, _ = make_settings(0, 2, peer_replicas=1, metrics_port=-1, preempt_grace_seconds=grace)
    s1, _ = make_settings(1, 2, peer_replicas=1, metrics_port=-1)
    sidecars(s1)
    sc = procs("sidecar-0", sidecar_argv(), sidecar_env(s0))
    tr = procs("trainer-0", trainer_argv("preempt", "1", "1", "2"), sidecar_env(s0))
    cat = Catalog(redis_server.url, job, 2)
    wait_for(lambda: "L1@1" in cat.holder_names(1, 0), timeout=90, what="step 1 of rank 0 replicated to rank 1")
    wait_for(lambda: '"holding"' in tr.output(), timeout=30, what="the trainer to wait for SIGTERM")
    return sc, tr, cat


def test_sigterm_sidecar_serves_its_preempted_trainer_until_it_left(make_settings, sidecars, procs, redis_server,
                                                                   job):
    sc, tr, cat = _two_ranks(make_settings, sidecars, procs, job, redis_server, grace=20)
    t0 = time.monotonic()
    os.kill(sc.p.pid, signal.SIGTERM)
    os.kill(tr.p.pid, signal.SIGTERM)
    tr_exit = _exit_time(tr, 30)
    assert tr.p.returncode == 143, tr.output()
    report = _last_json(tr)
    assert report["step"] == 2 and report["l1"] is True, report  # saved after SIGTERM, replicated by the sidecar
    assert "L1@1" in cat.holder_names(2, 0)
    sc_exit = _exit_time(sc, 15)
    assert sc.p.returncode == 0, sc.output()[-3000:]
    (draining,) = _events(sc, "draining")
    assert draining["trainers"] == 1  # it did wait for its trainer
    (drained,) = _events(sc, "drained")
    assert drained["why"] == "trainer gone" and drained["seconds"] >= report["seconds"]
    assert sc_exit - tr_exit < 3.0  # stopped once its trainer left, long before the 20 s grace
    print(f"trainer reported L1 {report['seconds']:.3f} s after SIGTERM, exited at {tr_exit - t0:.2f} s; "
          f"sidecar drained in {drained['seconds']:.2f} s, exited at {sc_exit - t0:.2f} s")
    cat.close()


def test_without_a_grace_the_sidecar_stops_at_once_and_the_last_step_misses_l1(make_settings, sidecars, procs,
                                                                               redis_server, job):
    """The behaviour the drain replaces: the sidecar is gone before its trainer's last save."""
    sc, tr, cat = _two_ranks(make_settings, sidecars, procs, job, redis_server, grace=0)
    t0 = time.monotonic()
    os.kill(sc.p.pid, signal.SIGTERM)
    sc_exit = _exit_time(sc, 15)
    os.kill(tr.p.pid, signal.SIGTERM)
    tr.wait(60)
    assert sc_exit - t0 < 5.0 and not _events(sc, "draining")
    assert "L1@1" not in cat.holder_names(2, 0)
    cat.close()


def test_a_draining_sidecar_stops_at_the_grace_when_its_trainer_stays(make_settings, procs, redis_server, job):
    """The trainer never leaves: the sidecar keeps heartbeating, then stops MARGIN_SECONDS before the grace."""
    grace = 3.0
    s, _ = make_settings(0, 1, peer_replicas=0, metrics_port=-1, preempt_grace_seconds=grace)
    sc = procs("sidecar-0", sidecar_argv(), sidecar_env(s))
    tr = procs("trainer-0", trainer_argv("save", "1", "1", "--hold"), sidecar_env(s))
    cat = Catalog(redis_server.url, job, 1)
    wait_for(lambda: '"holding"' in tr.output(), timeout=60, what="the trainer to hold")
    t0 = time.monotonic()
    os.kill(sc.p.pid, signal.SIGTERM)
    # no event marks a heartbeat: what is checked is an absence (the registration would have expired
    # after 3 heartbeat periods, 0.3 s, without heartbeats), so the test lets 1.5 s pass before it looks
    time.sleep(1.5)
    assert sc.p.poll() is None and 0 in cat.sidecars()
    sc_exit = _exit_time(sc, 15)
    (drained,) = _events(sc, "drained")
    assert drained["why"] == "grace"
    assert grace - 1.0 <= sc_exit - t0 <= grace + 3.0, sc_exit - t0
    assert tr.p.poll() is None  # the trainer was not the one that ended it
    cat.close()


def test_a_sidecar_without_a_trainer_stops_at_once(make_settings, procs, redis_server, job):
    s, _ = make_settings(0, 1, peer_replicas=0, metrics_port=-1, preempt_grace_seconds=30)
    sc = procs("sidecar-0", sidecar_argv(), sidecar_env(s))
    cat = Catalog(redis_server.url, job, 1)
    wait_for(lambda: 0 in cat.sidecars(), timeout=60, what="the sidecar to register")
    t0 = time.monotonic()
    os.kill(sc.p.pid, signal.SIGTERM)
    sc_exit = _exit_time(sc, 15)
    assert sc.p.returncode == 0
    assert [e["why"] for e in _events(sc, "drained")] == ["trainer gone"]
    assert sc_exit - t0 < 5.0
    cat.close()
