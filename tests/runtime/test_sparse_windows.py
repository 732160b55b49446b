"""Sparse expert checkpoints (MoEvement §4): slots, window restore and sparse-to-dense conversion.

The sidecar's log store is replaced by a dict here (a unit-test double); the real store is
exercised end to end by tests/launch/test_localized_replay.py's sparse case.
"""

from __future__ import annotations

import math

import pytest
import torch

from lifeline.checkpoint._slot import _header
from lifeline.checkpoint import Layout, SlotRecord, pack_slot, slot_entries, slot_record, unpack_slot
from lifeline.errors import ChecksumError, RecoveryError, SidecarError
from lifeline.models.gpt_moe import GPTMoEConfig, GPTMoETrainer, deterministic_cpu
from lifeline.runtime._sparse import SparseWindows

W = 3


class LogStoreDouble:
    """``put_log`` / ``get_log`` of a sidecar client, in memory."""

    def __init__(self) -> None:
        self.entries: dict = {}

    def put_log(self, key, data) -> None:
        self.entries[key] = bytearray(data)

    def get_log(self, key, rank=None) -> bytearray:
        if key not in self.entries:  # as the real client: the sidecar refused (held nowhere)
            raise SidecarError(f"upstream log {key} is not held anywhere")
        return bytearray(self.entries[key])


def snapshot(state) -> dict:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else bytes(v) for k, v in state.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert bytes(a[k]) == bytes(b[k]), k


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def run(request):
    """Eight steps with a slot captured after each, and the dense state of every step; FROZEN
    weights in the compute dtype drawn (fp32, or bfloat16 compute weights of fp32 masters)."""
    cfg = GPTMoEConfig(n_experts=4, corpus_bytes=1 << 16, compute_dtype=request.param)
    return (cfg, *train(GPTMoETrainer(cfg, Layout(), 0), 8))


def train(trainer: GPTMoETrainer, steps: int) -> tuple:
    """``steps`` steps of ``trainer`` with a slot captured after each: ``(store, windows, dense state
    per step, slot bytes per step)``."""
    deterministic_cpu()
    trainer.connect()
    store = LogStoreDouble()
    windows = SparseWindows(lambda: store, job="j", layout=Layout(), rank=0, rules=trainer.rules, stage=0, window=W)
    dense, sizes = {}, {}
    for _ in range(steps):
        result = trainer.train_step()
        sizes[result.step] = windows.capture(result.step, trainer, result.seconds)
        dense[result.step] = snapshot(trainer.state())
    return store, windows, dense, sizes


def fresh(cfg) -> GPTMoETrainer:
    trainer = GPTMoETrainer(cfg, Layout(), 0)
    trainer.connect()
    return trainer


def test_a_window_converts_to_the_dense_checkpoint_bit_for_bit(run):
    cfg, store, windows, dense, _ = run
    trainer = fresh(cfg)
    record = windows.restore(3, trainer)
    assert (record.start, record.index, trainer.step) == (3, 0, 3)
    while trainer.step < 8:
        result = trainer.train_step()
        windows.apply(result.step, 3, trainer)
        if result.step >= 3 + W - 1:  # the window is whole from its last slot on
            assert_same(snapshot(trainer.state()), dense[result.step])
    assert trainer.step == 8


def test_slots_capture_each_operator_active_once_and_cost_less_than_dense(run):
    cfg, store, windows, dense, sizes = run
    records = []
    for step in (3, 4, 5):
        data = store.entries[next(k for k in store.entries if k.iteration == step)]
        target = snapshot(dense[step])
        records.append(unpack_slot(data, target, layout=Layout(), rank=0, rules=fresh(cfg).rules))
    active = [op for r in records for op in r.active]
    ops, _ = fresh(cfg).sparse_operators()
    assert sorted(active) == sorted(op.name for op in ops) and len(active) == len(set(active))
    assert records[0].frozen == tuple(records[1].active + records[2].active)  # later slots are FROZEN
    assert records[2].frozen == ()
    assert active[-3:] == ["layers.0.moe.router", "layers.1.moe.router", "dense"]  # routers, then dense, last
    assert all(op.startswith("layers.") and ".experts." in op for op in active[:-3])
    dense_bytes = sum(v.numel() * v.element_size() for v in dense[3].values() if isinstance(v, torch.Tensor))
    assert max(sizes[s] for s in (3, 4, 5)) < dense_bytes


def test_a_corrupt_slot_is_refused_and_a_step_inside_a_window_is_not_a_start(run):
    cfg, store, windows, _, _ = run
    with pytest.raises(RecoveryError):
        windows.restore(4, fresh(cfg))
    key = next(k for k in store.entries if k.iteration == 6)
    store.entries[key][-1] ^= 0xFF
    with pytest.raises(ChecksumError):
        windows.restore(6, fresh(cfg))


def test_slot_record_validation():
    with pytest.raises(Exception, match="window"):
        SlotRecord(start=4, window=3, index=0, active=("a",), frozen=())
    with pytest.raises(Exception, match="both active and frozen"):
        SlotRecord(start=3, window=3, index=0, active=("a",), frozen=("a",))


def test_a_new_process_inside_a_window_goes_on_with_the_windows_schedule(run):
    cfg, store, windows, dense, _ = run
    stored = {k.iteration: slot_record(v) for k, v in store.entries.items()}
    assert all(len(r.plan) == W for r in stored.values())
    # a replaced trainer restores window 3 and re-runs step 4: its slot is the one the window holds
    trainer = fresh(cfg)
    later = SparseWindows(lambda: store, job="j", layout=Layout(), rank=0, rules=trainer.rules, stage=0, window=W)
    later.restore(3, trainer)
    result = trainer.train_step()
    later.apply(result.step, 3, trainer)
    before = bytes(store.entries[next(k for k in store.entries if k.iteration == 4)])
    assert later.capture(4, trainer, result.seconds) > 0
    after = store.entries[next(k for k in store.entries if k.iteration == 4)]
    assert bytes(after) == before, "the re-captured slot differs from the window's"
    # a process that never saw the window adopts its schedule from slot 0; without slot 0 it captures nothing
    blind = SparseWindows(lambda: store, job="j", layout=Layout(), rank=0, rules=trainer.rules, stage=0, window=W)
    target = fresh(cfg)
    target.load_state(dense[7])
    assert blind.capture(7, target, 0.01) > 0
    key7 = next(k for k in store.entries if k.iteration == 7)
    assert unpack_slot(store.entries[key7], snapshot(dense[7]), layout=Layout(), rank=0,
                       rules=trainer.rules).plan == stored[6].plan
    del store.entries[next(k for k in store.entries if k.iteration == 6)]
    orphan = SparseWindows(lambda: store, job="j", layout=Layout(), rank=0, rules=trainer.rules, stage=0, window=W)
    assert orphan.capture(7, target, 0.01) == 0


class ClaimsBfloat16(GPTMoETrainer):
    """A trainer whose forward pass uses fp32 weights but whose FROZEN copies are bfloat16."""

    compute_dtype = torch.bfloat16


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
def test_bfloat16_frozen_copies_replay_exactly_only_when_the_forward_pass_rounds_to_them(compute_dtype):
    cfg = GPTMoEConfig(n_experts=4, corpus_bytes=1 << 16, compute_dtype=compute_dtype)
    trainer = ClaimsBfloat16(cfg, Layout(), 0)
    store, windows, dense, sizes = train(trainer, 5)
    # slot 0 of window 3 holds its FROZEN operators' weights in bfloat16: 2 of fp32's 4 bytes per parameter
    ops, members = trainer.sparse_operators()
    record = slot_record(store.entries[next(k for k in store.entries if k.iteration == 3)])
    frozen = [n for op in record.frozen for n in members[op].weights]
    entries = slot_entries(trainer.state(), record, members, compute_dtype=torch.bfloat16)
    assert frozen and {entries[n].dtype for n in frozen} == {torch.bfloat16}
    assert {entries[n].dtype for op in record.active for n in members[op].weights} == {torch.float32}
    stored = {t.fqn: t for t in _header(memoryview(store.entries[next(k for k in store.entries if k.iteration == 3)]))[1].tensors}
    for n in frozen:  # the slot captured holds them so: 2 bytes per parameter
        assert stored[n].dtype == "bfloat16" and all(c.byte_length == 2 * math.prod(c.lengths) for c in stored[n].chunks)
    fp32 = pack_slot(slot_entries(dense[3], record, members), record, job="j", layout=Layout(), rank=0,
                     rules=trainer.rules)
    assert sizes[3] < len(fp32)
    # the window converts to the dense state bit for bit when the forward pass rounds to bfloat16, and not otherwise
    replayed = GPTMoETrainer(cfg, Layout(), 0)
    replayed.connect()
    windows.restore(3, replayed)
    while replayed.step < 5:
        windows.apply(replayed.train_step().step, 3, replayed)
    state = snapshot(replayed.state())
    exact = all(torch.equal(state[k], v) if isinstance(v, torch.Tensor) else state[k] == v for k, v in dense[5].items())
    assert exact == (compute_dtype == "bfloat16")
