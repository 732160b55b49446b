"""Survivors leave a broken collective within 2 s of a newer recovery plan (issue 22, defect 2).

Real gloo processes, a real Redis catalog, a 60 s collective timeout: without the watchdog the
survivor waits out those 60 s, and the controller would replace its healthy pod as silent.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from lifeline.api import LayoutSpec, RecoveryPlan
from lifeline.catalog import Catalog
from lifeline.runtime._watchdog import Watchdog

from ._harness import await_condition, events, job_name, rank_env, start, stop, wait_all

WORKER = str(Path(__file__).with_name("_watchdog_worker.py"))


def _event(log: Path, name: str, generation: int) -> dict | None:
    return next((e for e in events(log) if e.get("event") == name and e.get("generation") == generation), None)


OPS = ("recv", "all_reduce", "all_to_all")  # pipeline p2p; tensor-parallel; expert-parallel (sub-groups)


def test_a_survivor_blocked_on_a_replanned_peer_leaves_within_two_seconds_of_the_plan(tmp_path, redis_server):
    """One op per generation, in the same two processes: each time rank 0 leaves its op within 2 s
    of the plan's publication, with its tensors intact, and both ranks complete an all-reduce in the
    plan's generation."""
    job, world = job_name("wdog"), 2
    catalog = Catalog(redis_server.url, job, world)
    logs = {r: tmp_path / f"rank-{r}.log" for r in range(world)}
    env = {r: rank_env(job, r, world, redis_server.url, LIFELINE_COLLECTIVE_TIMEOUT_SECONDS="60") for r in range(world)}
    procs = {r: start([WORKER, *OPS], env[r], logs[r]) for r in range(world)}
    lefts = {}
    try:
        for g, op in enumerate(OPS):
            await_condition(lambda: _event(logs[0], "blocked", g) and _event(logs[1], "idle", g), 60,
                            f"rank 0 blocked in {op} (generation {g})")
            published = time.time()
            catalog.put_plan(RecoveryPlan.restore_all(g + 1, None, LayoutSpec(data=world)))
            lefts[op] = await_condition(lambda: _event(logs[0], "left", g), 20, f"rank 0 leaving its {op}")
            lefts[op]["after_plan"] = lefts[op]["time"] - published
    except TimeoutError as err:
        stop(procs)
        raise AssertionError(f"{err}; rank 0 log:\n{logs[0].read_text()[-3000:]}") from None
    wait_all(procs, logs, timeout=60)
    for g, op in enumerate(OPS):
        left = lefts[op]
        assert left["after_plan"] < 2.0, f"rank 0 left its {op} {left['after_plan']:.2f} s after the plan"
        assert left["error"] is not None and "closed" in left["error"].lower(), left
        assert left["intact"], f"the survivor's tensors changed in {op}"
        broke = _event(logs[0], "broke_group", g)
        assert broke is not None and broke["sockets"] >= 2, broke  # the default group's and the sub-group's
        assert _event(logs[1], "broke_group", g) is None  # rank 1 had no watchdog: rank 0's own broke the op
        for r in range(world):
            assert _event(logs[r], "rejoined", g + 1)["sum"] == 3.0


def _pair(port: int | None = None) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listening socket and one established TCP connection to it: (listener, client, accepted)."""
    listener = socket.create_server(("127.0.0.1", port or 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_watchdog_breaks_only_the_armed_generations_connections():
    generation = [0]
    fired: list[tuple[int, int]] = []
    dog = Watchdog(lambda: generation[0], lambda g, s, n: fired.append((g, n)), interval=0.01)
    old = _pair()  # opened before the mark: another generation's, or Redis
    excluded_listener = socket.create_server(("127.0.0.1", 0))
    excluded = excluded_listener.getsockname()[1]
    dog.reset(exclude_ports=[excluded, None])
    dog.mark()
    new = _pair()  # the generation's (both ends are this process's)
    store = (excluded_listener, socket.create_connection(("127.0.0.1", excluded)))
    assert dog.arm(0) == 2, "the new connection's two ends, not the listener nor the excluded port's"
    dog.mark()
    late = _pair()  # a sub-group's, opened under a second mark
    assert dog.arm(0) == 4
    generation[0] = 1
    await_condition(lambda: fired, 10, "the watchdog to fire")
    assert fired == [(0, 4)] and dog.broken == [0]
    for s in (new[1], new[2], late[1], late[2]):
        assert s.recv(1) == b"", "a watched connection was shut down"
    old[1].sendall(b"x")
    assert old[2].recv(1) == b"x", "a connection opened before the mark is untouched"
    store[1].sendall(b"y")
    assert store[0].accept()[0].recv(1) == b"y", "the excluded port's connection is untouched"
    dog.close()
    for s in (*old, *new, *late, *store):
        s.close()


def test_a_disarmed_generations_connections_are_never_broken():
    generation = [0]
    fired: list[tuple[int, int]] = []
    dog = Watchdog(lambda: generation[0], lambda g, s, n: fired.append((g, n)), interval=0.01)
    dog.reset()
    dog.mark()
    listener, client, accepted = _pair()
    assert dog.arm(0) == 2
    dog.disarm()  # teardown: before destroy_process_group closes the descriptors
    assert not dog.watched
    dog.reset()
    dog.mark()
    assert dog.arm(1) == 0  # the next generation opened nothing (yet)
    generation[0] = 2  # the watchdog fires for generation 1, never for the disarmed generation 0
    await_condition(lambda: fired, 10, "the watchdog to fire")
    assert fired == [(1, 0)] and dog.broken == [1]
    client.sendall(b"z")
    assert accepted.recv(1) == b"z"
    dog.close()
    for s in (listener, client, accepted):
        s.close()
