"""Units of the format: layouts, patterns, plans, metadata, manifest errors, corruption and fallback."""

from __future__ import annotations

import json
import math

import pytest
import torch
from ckpt_models import assert_states_equal, build_model, states_for

from lifeline.checkpoint import (
    ALIGN, Expert, FilesystemStorage, Layout, Manifest, MemoryStorage, PatternRules, Replicated,
    ShardMetadata, Sharded, SubParams, Zero1, blob_key, consolidate, list_steps, load, manifest_key, plan_shard,
    read_manifest, save_states, seal_shard, verify_checkpoint, write_shard,
)
from lifeline.checkpoint._patterns import flat_range_boxes
from lifeline.errors import ChecksumError, FormatVersionError, LayoutError, ManifestError, StorageError


def test_layout_rank_order_is_megatron():
    layout = Layout(tensor=2, pipeline=2, data=2, expert=2)
    assert layout.world_size == 16
    seen = set()
    for r in range(16):
        c = layout.coords(r)
        assert layout.rank(c) == r
        assert r == ((c.pipeline * 2 + c.data) * 2 + c.expert) * 2 + c.tensor
        seen.add((c.tensor, c.pipeline, c.data, c.expert))
    assert len(seen) == 16
    assert layout.coords(1).tensor == 1 and layout.coords(2).expert == 1 and layout.coords(8).pipeline == 1
    with pytest.raises(LayoutError):
        Layout(tensor=0).validate()
    with pytest.raises(LayoutError):
        layout.coords(16)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 3, 2)])
def test_flat_range_boxes_cover_exactly(shape):
    n = math.prod(shape)
    ref = torch.arange(n).view(shape)
    for start in range(0, n + 1, max(1, n // 7)):
        for stop in range(start, n + 1, max(1, n // 5)):
            got = []
            for rel, offs, lens in flat_range_boxes(shape, start, stop):
                box = ref[tuple(slice(o, o + l) for o, l in zip(offs, lens))].reshape(-1)
                assert torch.equal(box, torch.arange(start + rel, start + rel + box.numel()))
                got.append(box)
            flat = torch.cat(got) if got else torch.empty(0, dtype=torch.int64)
            assert torch.equal(flat, torch.arange(start, stop))


def test_plan_is_aligned_deterministic_and_reusable():
    model = build_model(1, 2, 2, 2, 11, 1, torch.bfloat16)
    layout = Layout(tensor=2, data=2, expert=2)
    state = model.state(layout, 5)
    plan = plan_shard(state, layout, 5, model.rules)
    assert plan == plan_shard(dict(reversed(list(state.items()))), layout, 5, model.rules)
    assert all(c.byte_offset % ALIGN == 0 for t in plan.tensors for c in t.chunks)
    assert plan.matches(state)
    changed = dict(state, embed=torch.zeros(3, 4, dtype=torch.bfloat16))
    assert not plan.matches(changed)
    with pytest.raises(LayoutError, match="embed"):
        write_shard(plan, changed, bytearray(plan.nbytes))
    with pytest.raises(StorageError):
        write_shard(plan, state, bytearray(plan.nbytes - 1))


def test_write_shard_into_tensor_and_memoryview_agree():
    model = build_model(2, 2, 1, 2, 9, 1, torch.float32)
    layout = Layout(tensor=2)
    state = model.state(layout, 1)
    plan = plan_shard(state, layout, 1, model.rules)
    a, b = bytearray(plan.nbytes), torch.zeros(plan.nbytes, dtype=torch.uint8)
    write_shard(plan, state, memoryview(a))
    write_shard(plan, state, b)
    assert bytes(a) == b.numpy().tobytes()
    meta = seal_shard(plan, a, job="j", step=1)
    assert ShardMetadata.from_json(meta.to_json()) == meta
    meta.verify(b)
    b[plan.tensors[0].chunks[0].byte_offset] ^= 1
    with pytest.raises(ChecksumError, match=plan.tensors[0].fqn):
        meta.verify(b)


def test_layout_the_model_cannot_take_names_the_tensor():
    rules = PatternRules([("qkv", SubParams(0, (6, 3, 3))), ("w", Sharded(1)), (r"re:x\.(?P<index>\d+)", Expert(num_experts=3))])
    with pytest.raises(LayoutError, match="qkv"):
        plan_shard({"qkv": torch.zeros(6, 2)}, Layout(tensor=2), 0, rules)  # 2 does not divide 3
    with pytest.raises(LayoutError, match="w"):
        plan_shard({"w": torch.zeros(2)}, Layout(tensor=2), 0, rules)  # dim 1 missing
    with pytest.raises(LayoutError, match="x.1"):
        plan_shard({"x.1": torch.zeros(2)}, Layout(expert=2), 0, rules)  # 2 does not divide 3 experts
    storage = MemoryStorage()
    save_states(storage, "", "j", 1, Layout(), PatternRules([("w", Sharded(0))]), [{"w": torch.zeros(6, 2)}])
    with pytest.raises(LayoutError, match="'w'"):
        load(storage, "", "j", 1, Layout(tensor=4), 0, PatternRules([("w", Sharded(0))]), {"w": torch.zeros(1, 2)})
    with pytest.raises(LayoutError, match="w"):
        load(storage, "", "j", 1, Layout(), 0, PatternRules(), {"w": torch.zeros(6, 2, dtype=torch.float64)})
    with pytest.raises(LayoutError, match="no pattern rule"):
        PatternRules(default=None).match("anything")


def _saved(tmp_path, layout=Layout(data=2)):
    model = build_model(3, layout.tensor, layout.expert, 4, 13, 2, torch.float32)
    storage = FilesystemStorage(tmp_path, fsync=False)
    save_states(storage, "p", "job", 5, layout, model.rules, states_for(model, layout), block_size=256)
    return model, storage


def test_missing_corrupt_and_future_manifests(tmp_path):
    model, storage = _saved(tmp_path)
    key = manifest_key("p", "job", 5)
    text = storage.get(key)
    with pytest.raises(ManifestError, match="not committed"):
        read_manifest(storage, "p", "job", 6)
    storage.put(key, text[: len(text) // 2])
    with pytest.raises(ManifestError, match="JSON") as err:
        read_manifest(storage, "p", "job", 5)
    assert err.value.key == key
    d = json.loads(text)
    d["version"] = 99
    storage.put(key, json.dumps(d).encode())
    with pytest.raises(FormatVersionError, match="99"):
        read_manifest(storage, "p", "job", 5)
    d["version"] = 1
    d["tensors"]["embed"]["chunks"][0][4] = 10**12
    storage.put(key, json.dumps(d).encode())
    with pytest.raises(ManifestError, match="embed"):
        read_manifest(storage, "p", "job", 5)
    storage.put(key, text)
    assert Manifest.from_json(text).to_json() == text.decode()


def test_saving_a_committed_step_is_refused_and_changes_nothing(tmp_path):
    model, storage = _saved(tmp_path)
    before = {k: storage.get(k) for k in storage.list("")}
    with pytest.raises(StorageError, match="already committed"):
        save_states(storage, "p", "job", 5, Layout(data=2), model.rules, states_for(model, Layout(data=2)))
    assert {k: storage.get(k) for k in storage.list("")} == before


def _flip(storage, key, offset):
    data = bytearray(storage.get(key))
    data[offset] ^= 0x40
    storage.put(key, data)


def test_any_flipped_byte_fails_naming_the_chunk_or_uses_the_next_copy(tmp_path):
    layout = Layout(tensor=2)  # no replica of sharded chunks; norms are replicated across tensor ranks
    model, storage = _saved(tmp_path, layout)
    manifest = read_manifest(storage, "p", "job", 5)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for trial in range(16):
        fqn = sorted(manifest.tensors)[int(torch.randint(len(manifest.tensors), (1,), generator=gen))]
        rec = manifest.tensors[fqn]
        ref = rec.chunks[int(torch.randint(len(rec.chunks), (1,), generator=gen))]
        same_box = [c for c in rec.chunks if (c.chunk.offsets, c.chunk.lengths) == (ref.chunk.offsets, ref.chunk.lengths)]
        ref = min(same_box, key=lambda c: c.rank)  # the copy consolidation reads first
        at = ref.chunk.byte_offset + int(torch.randint(ref.chunk.byte_length, (1,), generator=gen))
        key = blob_key("p", "job", 5, ref.rank)
        original = storage.get(key)
        _flip(storage, key, at)
        with pytest.raises(ChecksumError, match=fqn.replace(".", r"\.")):
            verify_checkpoint(storage, "p", "job", 5)
        seen.add(len(same_box) > 1)
        if len(same_box) > 1:
            full = consolidate(storage, "p", "job", 5)  # takes the next copy
            assert torch.equal(full[fqn], model.full[fqn])
            into = {k: torch.zeros_like(v) for k, v in states_for(model, layout)[ref.rank].items()}
            report = load(storage, "p", "job", 5, layout, ref.rank, model.rules, into)
            assert len(report.fallbacks) == 1 and fqn in report.fallbacks[0]
            assert torch.equal(into[fqn], model.state(layout, ref.rank)[fqn])
        else:
            with pytest.raises(ChecksumError, match=fqn.replace(".", r"\.")) as err:
                consolidate(storage, "p", "job", 5)
            assert str(list(ref.chunk.offsets)) in str(err.value) and err.value.rank == ref.rank
        storage.put(key, original)
    assert seen == {True, False}, "both a replicated and a unique chunk must have been corrupted"
    assert_states_equal(consolidate(storage, "p", "job", 5), {k: v for k, v in model.full.items()})


def test_missing_blob_is_a_storage_error_and_list_ignores_uncommitted(tmp_path):
    model, storage = _saved(tmp_path)
    storage.put(blob_key("p", "job", 6, 0), b"partial")  # a step that never committed
    assert list_steps(storage, "p", "job") == [5]
    storage.delete(blob_key("p", "job", 5, 1))
    with pytest.raises(StorageError, match="rank-1"):
        verify_checkpoint(storage, "p", "job", 5)


@pytest.mark.parametrize("backend", ["filesystem", "memory"])
def test_verify_reads_in_bounded_windows_and_checks_blob_lengths(tmp_path, backend):
    """A window smaller than the largest chunk: every window is checked (a flip in the last one of a
    chunk is named) and a blob longer or shorter than the manifest says is refused."""
    storage = FilesystemStorage(tmp_path, fsync=False) if backend == "filesystem" else MemoryStorage()
    g = torch.Generator().manual_seed(4)
    state = {"w": torch.randn(64, 64, generator=g), "n": torch.randn(8, generator=g), "rng": b"\x01\x02"}
    save_states(storage, "p", "job", 5, Layout(), PatternRules(), [state], block_size=256)
    manifest = read_manifest(storage, "p", "job", 5)
    fqn, ref = max(((f, c) for f, rec in manifest.tensors.items() for c in rec.chunks),
                   key=lambda x: x[1].chunk.byte_length)
    c = ref.chunk
    assert c.byte_length > 3 * 256, "the test needs a chunk of several windows"
    assert verify_checkpoint(storage, "p", "job", 5, window=512).step == 5
    key = blob_key("p", "job", 5, ref.rank)
    original = storage.get(key)
    _flip(storage, key, c.byte_offset + c.byte_length - 1)
    with pytest.raises(ChecksumError, match=fqn.replace(".", r"\.")) as err:
        verify_checkpoint(storage, "p", "job", 5, window=512)
    assert f"block {(c.byte_length - 1) // c.block_size}" in str(err.value)
    for bad in (original + b"x", original[:-1]):
        storage.put(key, bad)
        with pytest.raises(StorageError, match=f"blob has {len(bad)} bytes, manifest says {len(original)}"):
            verify_checkpoint(storage, "p", "job", 5)
    storage.put(key, original)
    verify_checkpoint(storage, "p", "job", 5)


def test_zero1_fragments_roundtrip_across_data_degrees():
    rules = PatternRules([("w", Sharded(1)), ("m.(*)", Zero1(r"\1"))])
    full = {"w": torch.arange(6 * 8, dtype=torch.float32).view(6, 8), "m.w": -torch.arange(48.0).view(6, 8)}
    storage = MemoryStorage()
    from lifeline.checkpoint import shard_state

    a = Layout(tensor=2, data=3)
    save_states(storage, "", "z", 1, a, rules, [shard_state(full, a, r, rules) for r in range(6)])
    assert_states_equal(consolidate(storage, "", "z", 1), full)
    b = Layout(tensor=4, data=5)
    for r in range(b.world_size):
        want = shard_state(full, b, r, rules)
        into = {k: torch.zeros_like(v) for k, v in want.items()}
        load(storage, "", "z", 1, b, r, rules, into)
        assert_states_equal(into, want)


def test_replicated_rule_default_and_globs_capture():
    rules = PatternRules([("a.*.b", Sharded(0)), ("re:x(\\d)", Replicated())], default=Sharded(1))
    assert rules.match("a.3.b") == Sharded(0)
    assert rules.match("x1") == Replicated()
    assert rules.match("zz") == Sharded(1)
    assert PatternRules([("o.(*)", Zero1(r"p.\1"))]).match("o.(q.r)") == Zero1("p.q.r")


def test_persist_shard_seals_while_writing_and_commits(tmp_path):
    from lifeline.checkpoint import commit, persist_shard

    model = build_model(4, 2, 1, 8, 30, 1, torch.float16)
    layout = Layout(tensor=2)
    storage = FilesystemStorage(tmp_path, fsync=True)
    metas = []
    for r, state in enumerate(states_for(model, layout)):
        plan = plan_shard(state, layout, r, model.rules)
        blob = torch.empty(plan.nbytes, dtype=torch.uint8)
        write_shard(plan, state, blob)
        meta = persist_shard(storage, "p", plan, blob, job="j", step=2)
        meta.verify(storage.get(blob_key("p", "j", 2, r)))
        metas.append(meta)
    assert list_steps(storage, "p", "j") == []  # blobs alone are not a checkpoint
    commit(storage, "p", "j", 2, layout, metas)
    assert_states_equal(consolidate(storage, "p", "j", 2), model.full)
    with pytest.raises(StorageError, match="already committed"):
        persist_shard(storage, "p", plan, blob, job="j", step=2)


def test_persist_state_writes_the_same_blob_without_staging(tmp_path):
    from lifeline.checkpoint import MemoryStorage, persist_state

    model = build_model(6, 2, 2, 3, 19, 2, torch.bfloat16)  # SubParams(1, ...) chunks are strided: copied once
    layout = Layout(tensor=2, expert=2)
    for storage in (FilesystemStorage(tmp_path, fsync=True), MemoryStorage()):
        metas = []
        for r, state in enumerate(states_for(model, layout)):
            state["rng"] = b"r" * (r + 3)
            plan = plan_shard(state, layout, r, model.rules)
            staged = bytearray(plan.nbytes)
            write_shard(plan, state, staged)
            meta = persist_state(storage, "", plan, state, job="j", step=1)
            assert storage.get(blob_key("", "j", 1, r)) == bytes(staged)
            assert meta == seal_shard(plan, staged, job="j", step=1)
            metas.append(meta)
        from lifeline.checkpoint import commit

        commit(storage, "", "j", 1, layout, metas)
        assert_states_equal(consolidate(storage, "", "j", 1), model.full)
