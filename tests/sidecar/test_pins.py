"""Pins of held copies (seed 5098): each pin is dropped exactly once, and a wait for an arena slot ends
with the trainer that asked for it."""

from __future__ import annotations

import socket
import threading

from lifeline.sidecar._memory import Memory
from lifeline.sidecar._trainer_conn import _hung_up
from lifeline.sidecar._workers import PersistDue
from lifeline.sidecar.store import Holding, Store
from lifeline.api.pod import SidecarSettings


def _h(step: int) -> Holding:
    return Holding("shard", step, 0, 8, memoryview(bytearray(8)), "{}", "L0", None)


class Unpins:
    """The memory's ``unpin``, recorded (a unit-test double: the real one is tested below and end to end)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def unpin(self, h: Holding) -> None:
        self.steps.append(h.step)


def test_a_step_superseded_while_the_persister_retries_it_is_unpinned_once():
    """Seed 5098: MinIO was down while step 8 was persisted; step 10 was offered during the retry's
    back-off, and both the offer and the persister unpinned step 8: its pin count went to -1 and the
    store never evicted it, so the trainer waited for an arena slot until the job was declared hung."""
    memory, stop = Unpins(), threading.Event()
    due = PersistDue(memory)
    h8, h10 = _h(8), _h(10)
    due.offer(h8)
    assert due.take(stop) is h8  # the persister owns step 8's pin now
    due.offer(h10)  # offered while step 8 is being persisted: nothing of step 8 to unpin here
    assert memory.steps == []
    assert due.retry(h8) is False and memory.steps == [8]  # superseded: unpinned by the persister, once
    assert due.take(stop) is h10
    assert due.retry(h10) is True and memory.steps == [8]  # nothing newer: due again, still pinned
    assert due.take(stop) is h10
    due.offer(_h(12))
    due.offer(_h(14))  # a waiting step superseded before it was taken: unpinned by the offer
    assert memory.steps == [8, 12]
    stop.set()
    assert due.take(stop).step == 14 and due.take(stop) is None


def test_an_extra_unpin_leaves_the_count_at_zero_and_the_copy_evictable():
    evicted: list[Holding] = []
    store = Store(memory_bytes=1000, on_evict=evicted.append)
    for step in (1, 2):
        store.add(_h(step))
    store.latest_complete = 2
    h = store.pin("shard", 1, 0)
    assert store.unpin(h) is True and store.unpin(h) is False and h.pins == 0
    assert store.make_room(992) and [e.step for e in evicted] == [1]


def test_a_wait_for_an_arena_slot_ends_when_its_trainer_hangs_up(tmp_path):
    settings = SidecarSettings(job="j", rank=0, world_size=1, node="n", secret="s" * 32, redis_url="redis://x:1/0",
                               arena_dir=tmp_path, slots=2, slot_bytes=4096)
    memory = Memory(settings, threading.Event(), on_evict=lambda h: None)
    try:
        assert {memory.acquire_slot(0), memory.acquire_slot(0)} == {0, 1}  # every slot lent
        trainer, sidecar_end = socket.socketpair()
        assert not _hung_up(sidecar_end)
        got: list[int | None] = []
        waiter = threading.Thread(target=lambda: got.append(memory.acquire_slot(600.0, lambda: _hung_up(sidecar_end))))
        waiter.start()
        trainer.close()  # the trainer was killed while it waited
        waiter.join(timeout=30)
        assert not waiter.is_alive() and got == [None]
        memory.release_slot(1)
        assert memory.acquire_slot(0) == 1  # the slot freed later goes to the next trainer, not the dead one
        sidecar_end.close()
    finally:
        memory.close(unlink=True)
