"""Sparse windows persist to L2 (a real MinIO): slots as objects, the manifest last, two windows kept,
and a sidecar that holds no slot in memory reads it from its committed window, verified."""

from __future__ import annotations

import pytest
import torch
from conftest import wait_for

from lifeline.catalog import Catalog
from lifeline.checkpoint import (
    Layout,
    PatternRules,
    Replicated,
    SlotRecord,
    StorageOptions,
    pack_slot,
    read_window_manifest,
    storage_from_uri,
    window_slot_key,
    window_starts,
)
from lifeline.errors import LifelineError
from lifeline.sidecar.client import LogKey, SidecarClient

W = 4
RULES = PatternRules([("re:.*", Replicated())], default=None)


def _slot(job: str, step: int) -> bytearray:
    """A packed slot of a two-operator state: operator ``a`` ACTIVE in slot 0, ``b`` in the others."""
    index = step % W
    record = SlotRecord(step - index, W, index, ("a",) if index == 0 else ("b",), ("b",) if index == 0 else ())
    entries = {("a" if index == 0 else "b"): torch.full((64,), float(step))}
    return pack_slot(entries, record, job=job, layout=Layout(), rank=0, rules=RULES)


def _l2(minio) -> dict:
    return dict(persist_uri="s3://lifeline-test/windows", s3_endpoint=minio.endpoint, s3_access_key=minio.access_key,
                s3_secret_key=minio.secret_key, persist_every=1, persist_retries=1, peer_replicas=0)


def test_windows_commit_to_l2_and_serve_a_sidecar_that_lost_its_memory(make_settings, sidecars, redis_server,
                                                                      minio_server, job):
    s0, t0 = make_settings(0, 1, **_l2(minio_server))
    first = sidecars(s0)
    cat = Catalog(redis_server.url, job, 1)
    storage, prefix = storage_from_uri(s0.persist_uri, StorageOptions(
        endpoint=minio_server.endpoint, access_key=minio_server.access_key, secret_key=minio_server.secret_key))
    slots = {step: _slot(job, step) for step in range(4, 18)}
    with SidecarClient(t0) as c0:
        for step in range(4, 12):
            c0.put_log(LogKey(step, 0, 0, "slot"), slots[step])
        wait_for(lambda: [w.starts for w in cat.persisted_windows()] == [(4, 8)], timeout=60,
                 what="windows 4 and 8 committed")
        manifest = read_window_manifest(storage, prefix, job, 0, 8)
        assert [(s.record.step, s.record.active, s.nbytes) for s in manifest.slots] == [
            (8, ("a",), len(slots[8])), (9, ("b",), len(slots[9])), (10, ("b",), len(slots[10])),
            (11, ("b",), len(slots[11]))]
        for step in range(12, 16):  # a third window: the oldest is deleted, manifest first
            c0.put_log(LogKey(step, 0, 0, "slot"), slots[step])
        wait_for(lambda: [w.starts for w in cat.persisted_windows()] == [(8, 12)], timeout=60, what="window 12")
        assert window_starts(storage, prefix, job, 0) == [8, 12]
        assert not storage.exists(window_slot_key(prefix, job, 0, 5))
        c0.put_log(LogKey(16, 0, 0, "slot"), slots[16])  # an incomplete window is never committed
        c0.put_log(LogKey(17, 0, 0, "slot"), slots[17])
        wait_for(lambda: storage.exists(window_slot_key(prefix, job, 0, 17)), timeout=60, what="slot 17 stored")
        assert window_starts(storage, prefix, job, 0) == [8, 12]
    first.stop()

    s0b, t0b = make_settings(0, 1, arena="r0-after", **_l2(minio_server))  # a new pod: empty memory, no peers
    sidecars(s0b)
    with SidecarClient(t0b) as c0:
        for step in (8, 9, 14):
            assert bytes(c0.get_log(LogKey(step, 0, 0, "slot"))) == bytes(slots[step])
        with pytest.raises(LifelineError, match="not held anywhere"):
            c0.get_log(LogKey(17, 0, 0, "slot"))  # stored, but its window has no manifest
        bad = bytearray(slots[10])
        bad[-1] ^= 0xFF
        storage.put(window_slot_key(prefix, job, 0, 10), bytes(bad))
        with pytest.raises(LifelineError, match="does not match its window manifest"):
            c0.get_log(LogKey(10, 0, 0, "slot"))
    wait_for(lambda: any(r.tier == "L2" and r.step == 10 for r in cat.corrupt_reports()), what="corruption reported")
    cat.close()
