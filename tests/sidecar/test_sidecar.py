"""In-process sidecars (threads) against a real Redis: L0, backpressure, L1 replication, faults."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
import torch
from _trainer import empty_like, identical, state_at
from conftest import SECRET, wait_for

from lifeline.errors import ArenaFullError, AuthError, ChecksumError, RecoveryError
from lifeline.sidecar import frames as _frames
from lifeline.catalog import Catalog
from lifeline.sidecar.client import SidecarClient
from lifeline.sidecar.peer import PeerClient
from lifeline.sidecar.ulog import LogKey


def _metric(sc, name: str, **labels) -> float:
    value = sc.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_save_then_restore_from_l0_is_bit_identical(make_settings, sidecars):
    s, t = make_settings(0, 1, peer_replicas=0)
    sc = sidecars(s)
    with SidecarClient(t) as c:
        for step in range(4):
            r = c.save(step, state_at(step, 0))
            assert not r.skipped and r.nbytes > 0 and r.stall_seconds >= r.waited_seconds >= 0
        wait_for(lambda: c.latest_complete_step() == 3, what="step 3 complete at L0")
        into = empty_like(0)
        res = c.restore(into=into)
        assert (res.step, res.tier) == (3, "L0") and identical(into, state_at(3, 0))
        older = empty_like(0)
        assert c.restore(step=2, into=older).step == 2 and identical(older, state_at(2, 0))
    # K=2 kept in L0: step 1 and 0 were evicted
    assert sc.store.steps("shard", 0) == [2, 3]
    assert _metric(sc, "lifeline_sidecar_trainer_stall_seconds_count") == 4
    base = f"http://{s.pod_ip}:{sc.metrics_port}"
    assert httpx.get(base + "/healthz").status_code == 200
    body = httpx.get(base + "/metrics").text
    assert 'lifeline_sidecar_held_bytes{tier="L0"}' in body and "lifeline_sidecar_trainer_stall_seconds_bucket" in body
    sc.stop()
    assert not list(s.arena_dir.glob("slot-*.bin"))  # a stopped sidecar frees its Memory-backed arena


def test_a_corrupt_l0_copy_makes_the_sidecar_scrub_and_drop_every_corrupt_copy_of_that_rank(
        make_settings, sidecars, redis_server, job):
    """Fuzz seed 804: an L0 flip had corrupted both of a rank's slots; each restore found one, so each
    plan named the next corrupt copy (one extra recovery per slot). The first detection drops them all."""
    s, t = make_settings(0, 1, peer_replicas=0, keep=3)
    sc = sidecars(s)
    cat = Catalog(redis_server.url, job, 1)
    with SidecarClient(t) as c:
        for step in range(3):
            c.save(step, state_at(step, 0))
        wait_for(lambda: c.latest_complete_step() == 2, what="step 2 complete at L0")
        for step in (1, 2):  # bit rot in two of the three slots
            sc.store.get("shard", step, 0).buf[200] ^= 0x01
        with pytest.raises(RecoveryError, match="no verified copy of step 2"):
            c.restore(step=2, into=empty_like(0))
        assert sc.store.steps("shard", 0) == [0]  # the scrub dropped step 1's corrupt copy too
        assert [(r.step, r.tier) for r in cat.corrupt_reports()] == [(2, "L0"), (1, "L0")]
        assert "L0@0" not in cat.holder_names(1, 0) and "L0@0" in cat.holder_names(0, 0)
        into = empty_like(0)
        assert c.restore(step=0, into=into).tier == "L0" and identical(into, state_at(0, 0))
    cat.close()


def test_restore_takes_byte_entry_lengths_from_the_stored_shard(make_settings, sidecars):
    # A restarted trainer restores into a fresh state whose byte entries (data-loader position
    # as JSON, say) are shorter than the saved ones: every offset after them must still come
    # from the stored shard, not from a plan of the fresh state.
    s, t = make_settings(0, 1, peer_replicas=0)
    sidecars(s)
    saved = state_at(3, 0) | {"loader": b'{"position": 123456789}', "zz.after": torch.arange(7.0)}
    with SidecarClient(t) as c:
        c.save(3, saved)
        wait_for(lambda: c.latest_complete_step() == 3, what="step 3 complete at L0")
        fresh = empty_like(0) | {"loader": b'{"position": 0}', "zz.after": torch.zeros(7)}
        assert c.restore(into=fresh).step == 3
    assert identical(fresh, saved)


def test_arena_full_skip_and_measured_wait(make_settings, sidecars):
    s, t = make_settings(0, 1, slots=2, peer_replicas=0, trainer={"backpressure": "skip"})
    sc = sidecars(s)
    with SidecarClient(t) as c, SidecarClient(t) as other:
        # another writer holds both slots (lent, not yet committed): the arena is full
        lent = [other._call({"op": "acquire", "nbytes": 4096, "policy": "skip"}, "acquire")["slot"] for _ in range(2)]
        r = c.save(0, state_at(0, 0))
        assert r.skipped and r.nbytes == 0
        c.policy, c.wait_timeout = "wait", 0.3
        with pytest.raises(ArenaFullError):
            c.save(0, state_at(0, 0))
        c.wait_timeout = 60.0
        result = {}
        saver = threading.Thread(target=lambda: result.setdefault("r", c.save(0, state_at(0, 0))))
        saver.start()
        wait_for(lambda: _metric(sc, "lifeline_sidecar_waiting_saves") == 1, what="the save waiting for a slot")
        other._call({"op": "abort", "slot": lent[0]}, "abort")  # a slot frees: the waiting save goes on
        saver.join(60)
        assert not result["r"].skipped and result["r"].waited_seconds > 0
        assert result["r"].stall_seconds >= result["r"].waited_seconds
        into = empty_like(0)
        assert c.restore(into=into).step == 0 and identical(into, state_at(0, 0))


def test_replication_and_complete_only_when_every_rank_is_verified(make_settings, sidecars, redis_server, job):
    s0, t0 = make_settings(0, 2, peer_replicas=1)
    s1, t1 = make_settings(1, 2, peer_replicas=1)
    a, b = sidecars(s0), sidecars(s1)
    cat = Catalog(redis_server.url, job, 2)
    with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
        for step in range(2):
            c0.save(step, state_at(step, 0))
            c1.save(step, state_at(step, 1))
        wait_for(lambda: cat.latest_complete_step() == 1, what="step 1 complete at L1")
        assert cat.holder_names(1, 0) >= {"L0@0", "L1@1"} and cat.holder_names(1, 1) >= {"L0@1", "L1@0"}
        assert b.store.get("shard", 1, 0).tier == "L1" and a.store.get("shard", 1, 1).tier == "L1"
        c0.save(2, state_at(2, 0))  # only rank 0 saves step 2
        wait_for(lambda: "L1@1" in cat.holder_names(2, 0), what="rank 0's step 2 replicated")
        assert cat.try_advance(2, "L1", rank=0) == 1 and cat.latest_complete_step() == 1
        c1.save(2, state_at(2, 1))
        wait_for(lambda: cat.latest_complete_step() == 2, what="step 2 complete")
    assert _metric(a, "lifeline_sidecar_replicated_bytes_total") > 0
    cat.close()


def test_wrong_or_missing_secret_gets_nothing(make_settings, sidecars):
    s, _ = make_settings(0, 1, peer_replicas=0)
    sc = sidecars(s)
    with pytest.raises(AuthError):
        PeerClient(s.pod_ip, sc.peer_port, secret=b"wrong-secret-of-some-length!!", job=s.job)
    raw = socket.create_connection((s.pod_ip, sc.peer_port), timeout=10)
    with raw:
        assert _frames.recv_ctrl(raw)["op"] == "challenge"
        _frames.send_ctrl(raw, {"op": "get", "kind": "shard", "step": 0, "rank": 0})  # no authentication
        assert raw.recv(1) == b""
    wait_for(lambda: _metric(sc, "lifeline_sidecar_errors_total", kind="auth") == 2, what="auth errors counted")


def test_peer_disconnect_mid_transfer_and_corrupt_transfer_leave_nothing(make_settings, sidecars):
    s, t = make_settings(0, 1, peer_replicas=0)
    sc = sidecars(s)
    with SidecarClient(t) as c:
        c.save(0, state_at(0, 0))
    wait_for(lambda: sc.store.get("shard", 0, 0) is not None, what="step 0 sealed")
    good = sc.store.get("shard", 0, 0)
    blob, meta = bytes(good.buf), good.meta
    secret = SECRET.encode()
    # 1. half the bytes, then the peer vanishes
    pc = PeerClient(s.pod_ip, sc.peer_port, secret=secret, job=s.job)
    pc.chan.send_ctrl({"op": "put", "kind": "shard", "step": 7, "rank": 5, "nbytes": len(blob), "meta": meta})
    assert pc.chan.recv_ctrl()["op"] == "ready"
    pc.chan.send_data(memoryview(blob)[: len(blob) // 2])
    pc.close()
    wait_for(lambda: _metric(sc, "lifeline_sidecar_errors_total", kind="peer") == 1, what="disconnect counted")
    assert sc.store.get("shard", 7, 5) is None
    # 2. bytes that do not match their chunk checksums are refused, not held
    bad = bytearray(blob)
    bad[100] ^= 0xFF
    with PeerClient(s.pod_ip, sc.peer_port, secret=secret, job=s.job) as pc, pytest.raises(ChecksumError):
        pc.put(kind="shard", step=8, rank=5, blob=memoryview(bad), meta=meta)
    assert sc.store.get("shard", 8, 5) is None
    assert _metric(sc, "lifeline_sidecar_errors_total", kind="checksum") == 1
    # 3. the sidecar still serves: a good put is held, a byte range is served exactly
    with PeerClient(s.pod_ip, sc.peer_port, secret=secret, job=s.job) as pc:
        pc.put(kind="shard", step=9, rank=5, blob=memoryview(blob), meta=meta)
        got, _ = pc.get(kind="shard", step=9, rank=5, offset=64, length=1000)
        assert bytes(got) == blob[64:1064]
    assert sc.store.get("shard", 9, 5).tier == "L1"


def test_upstream_log_put_get_from_replica_and_gc(make_settings, sidecars):
    s0, t0 = make_settings(0, 2, peer_replicas=1)
    s1, t1 = make_settings(1, 2, peer_replicas=1)
    a, b = sidecars(s0), sidecars(s1)
    key = LogKey(iteration=3, micro_batch=1, stage=0, direction="fwd")
    act = torch.arange(1000, dtype=torch.float32)
    with SidecarClient(t0) as c0:
        c0.put_log(key, act)
        assert bytes(c0.get_log(key)) == act.numpy().tobytes()
    wait_for(lambda: b.store.get("ulog", 3, 0, key.name) is not None, what="log replicated")
    a.stop()  # rank 0's node is gone: rank 1 serves the replica
    with SidecarClient(t1) as c1:
        assert bytes(c1.get_log(key, rank=0)) == act.numpy().tobytes()
        assert c1.gc_logs(before=4) == 1
        assert b.store.get("ulog", 3, 0, key.name) is None


def test_log_coverage_is_recorded_once_the_entries_reached_the_peer_and_never_across_a_hole(
        make_settings, sidecars, redis_server, job):
    """Issue 22: a plan relies on replicated upstream-log coverage only. An entry no peer acknowledged
    (the peer's sidecar died, its registration not yet expired) is a hole: coverage starts after it."""
    from lifeline.catalog import LogCoverage

    s0, t0 = make_settings(0, 2, peer_replicas=1)
    s1, _ = make_settings(1, 2, peer_replicas=1, heartbeat_seconds=30)  # registered long after it died
    a, b = sidecars(s0), sidecars(s1)
    cat = Catalog(redis_server.url, job, 2)
    wait_for(lambda: set(cat.sidecars()) == {0, 1}, what="both sidecars registered")
    act = torch.arange(256, dtype=torch.float32)
    with SidecarClient(t0) as c0:
        b.stop()  # before any replication: step 1's entry reaches no peer
        c0.put_log(LogKey(0, 0, 0, "fwd"), act)
        c0.log_done(1, 1)
        # both attempts at the dead peer failed before the replacement registers: a slower replicator
        # would otherwise send step 1's entry to the replacement, and step 1 would be covered (a CI run)
        wait_for(lambda: _metric(a, "lifeline_sidecar_errors_total", kind="peer") >= 2,
                 what="step 1's entry failed at the dead peer")
        s1_new, _ = make_settings(1, 2, node="n9", ip="127.0.0.9", arena="r1-new", peer_replicas=1)
        b_new = sidecars(s1_new)
        wait_for(lambda: cat.sidecar(1).host == "127.0.0.9", what="the replacement peer registered")
        for iteration in (1, 2):  # steps 2 and 3 reach it
            c0.put_log(LogKey(iteration, 0, 0, "fwd"), act + iteration)
        c0.log_done(1, 3)
        wait_for(lambda: cat.log_coverage(), timeout=30, what="a coverage recorded")
        assert cat.log_coverage() == (LogCoverage(0, 2, 3),)  # never from step 1: it has no replica
        assert all(b_new.store.get("ulog", i, 0, LogKey(i, 0, 0, "fwd").name) is not None for i in (1, 2))
    cat.close()


def test_redis_restart_sidecars_reregister_and_catalog_recovers(make_settings, sidecars, job):
    from lifeline.devcluster.services import RedisServer

    redis = RedisServer().start()
    port = redis.port
    try:
        s0, t0 = make_settings(0, 2, peer_replicas=1, redis_url=redis.url)
        s1, t1 = make_settings(1, 2, peer_replicas=1, redis_url=redis.url)
        a, b = sidecars(s0), sidecars(s1)
        cat = Catalog(redis.url, job, 2)
        with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
            c0.save(0, state_at(0, 0))
            c1.save(0, state_at(0, 1))
            wait_for(lambda: cat.latest_complete_step() == 0, what="step 0 complete")
            redis.stop()
            wait_for(lambda: a.catalog_dirty and b.catalog_dirty, what="sidecars notice Redis is gone")
            # L0 goes on without the catalog: saves return, the restore still finds the copy in memory
            assert not c0.save(1, state_at(1, 0)).skipped
            into = empty_like(0)
            assert c0.restore(step=1, into=into).tier == "L0" and identical(into, state_at(1, 0))
            redis = RedisServer(port=port).start()  # a fresh, empty Redis on the same address
            wait_for(lambda: not a.catalog_dirty and not b.catalog_dirty, timeout=30, what="re-registration")
            assert cat.sidecar(0) is not None and cat.sidecar(1) is not None
            assert "L0@0" in cat.holder_names(0, 0) and "L1@1" in cat.holder_names(0, 0)
            assert cat.latest_complete_step() == 0  # re-derived from the re-registered holdings
            c1.save(1, state_at(1, 1))
            wait_for(lambda: cat.latest_complete_step() == 1, what="step 1 complete after the restart")
        cat.close()
        assert json.loads(json.dumps(a.health()))[0] is True
    finally:
        redis.stop()


def test_reshard_reads_byte_ranges_from_peer_memory(make_settings, sidecars, redis_server, job):
    from lifeline.checkpoint import Layout, PatternRules, Replicated, Sharded, load_shard, plan_shard
    from lifeline.sidecar.client.reader import SidecarBlobReader, manifest_from_catalog

    rules = PatternRules([("w", Sharded(0)), ("b", Replicated())])
    full_w = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
    bias = torch.arange(8, dtype=torch.float32)
    s0, t0 = make_settings(0, 2, peer_replicas=1)
    s1, t1 = make_settings(1, 2, peer_replicas=1)
    a, b = sidecars(s0), sidecars(s1)
    cat = Catalog(redis_server.url, job, 2)
    with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
        for r, c in ((0, c0), (1, c1)):
            state = {"w": full_w[32 * r : 32 * (r + 1)].clone(), "b": bias.clone()}
            c.save(5, state, plan_shard(state, Layout(tensor=2), r, rules))
        wait_for(lambda: cat.latest_complete_step() == 5, what="step 5 complete")
    a.stop()  # rank 0's node is gone: its blob is only in rank 1's memory now
    manifest = manifest_from_catalog(cat, 5)
    into = {"w": torch.zeros(64, 8), "b": torch.zeros(8)}
    with SidecarBlobReader(cat, secret=SECRET.encode(), job=job, local=0) as reader:
        report = load_shard(manifest, reader, Layout(), 0, rules, into)
    assert torch.equal(into["w"], full_w) and torch.equal(into["b"], bias)
    # every byte came from rank 1's memory: its own blob (L0) and its replica of rank 0's (L1)
    assert reader.bytes_by_tier["L2"] == 0
    assert reader.bytes_by_tier["L0"] > 0 and reader.bytes_by_tier["L1"] > 0
    assert sum(reader.bytes_by_tier.values()) == report.read_bytes
    cat.close()


def test_reshard_reads_this_pods_own_blob_in_place_from_the_arena(make_settings, sidecars, redis_server, job):
    """With the pod's client, the blob its own sidecar keeps in an arena slot is read through shared
    memory (no socket), the peer's over TCP; a corrupted arena byte is caught by the loader's checks."""
    from lifeline.checkpoint import Layout, PatternRules, Sharded, load_shard, plan_shard
    from lifeline.sidecar.client.reader import SidecarBlobReader, manifest_from_catalog

    rules = PatternRules([("w", Sharded(0))])
    full_w = torch.randn(64, 32, generator=torch.Generator().manual_seed(5))
    s0, t0 = make_settings(0, 2, peer_replicas=1)
    s1, t1 = make_settings(1, 2, peer_replicas=1)
    a, b = sidecars(s0), sidecars(s1)
    cat = Catalog(redis_server.url, job, 2)
    with SidecarClient(t0) as c0, SidecarClient(t1) as c1:
        for r, c in ((0, c0), (1, c1)):
            state = {"w": full_w[32 * r: 32 * (r + 1)].clone()}
            c.save(5, state, plan_shard(state, Layout(tensor=2), r, rules))
        wait_for(lambda: cat.latest_complete_step() == 5, what="step 5 complete")
        manifest = manifest_from_catalog(cat, 5)
        into = {"w": torch.zeros(64, 32)}
        with SidecarBlobReader(cat, secret=SECRET.encode(), job=job, local=0, local_client=c0) as reader:
            load_shard(manifest, reader, Layout(), 0, rules, into)
        assert torch.equal(into["w"], full_w)
        half = 32 * 32 * 4
        # its own blob in place; rank 1's from the replica its own sidecar holds (a buffer, not a slot: TCP)
        assert reader.local_bytes == reader.bytes_by_tier["L0"] >= half and reader.bytes_by_tier["L1"] >= half
        assert reader.bytes_by_tier["L2"] == 0
        assert a.store.get("shard", 5, 0).pins == 0  # released on close
        h = a.store.get("shard", 5, 0)
        h.buf[h.nbytes // 2] ^= 0xFF  # a flipped bit in this pod's arena copy
        with SidecarBlobReader(cat, secret=SECRET.encode(), job=job, local=0, local_client=c0) as reader, \
                pytest.raises(ChecksumError):
            load_shard(manifest, reader, Layout(), 0, rules, {"w": torch.zeros(64, 32)})
    cat.close()


def test_peer_over_the_memory_bound_is_refused(make_settings, sidecars):
    from lifeline.errors import PeerError

    s, _ = make_settings(0, 1, peer_replicas=0, memory_bytes=8192)
    sc = sidecars(s)
    with PeerClient(s.pod_ip, sc.peer_port, secret=SECRET.encode(), job=s.job) as pc, \
            pytest.raises(PeerError, match="memory bound"):
        pc.put(kind="ulog", step=0, rank=3, blob=memoryview(bytearray(10000)), meta='{"crc32c": 0}')
    assert sc.store.held_bytes() == 0
    assert _metric(sc, "lifeline_sidecar_errors_total", kind="memory") == 1


def test_an_overlapped_save_commits_the_state_as_it_was_and_settles_before_a_restore(make_settings, sidecars,
                                                                                    redis_server, job):
    """CheckFreq's pipelined snapshot: the copy runs while the trainer goes on reading; it is joined
    and committed by wait() (before the trainer's next update), or by a restore."""
    s0, t0 = make_settings(0, 1, peer_replicas=0)
    sidecars(s0)
    cat = Catalog(redis_server.url, job, 1)
    with SidecarClient(t0) as c0:
        state = state_at(1, 0)
        pending = c0.save_overlapped(1, state)
        assert cat.latest_complete_step() is None  # nothing is committed before the wait
        receipt = pending.wait()
        assert (receipt.step, receipt.skipped, receipt.nbytes > 0) == (1, False, True)
        assert pending.wait() is receipt  # idempotent
        wait_for(lambda: cat.latest_complete_step() == 1, what="step 1 complete")
        for v in state.values():  # the trainer's next update: only after the wait
            if isinstance(v, torch.Tensor):
                v.add_(1)
        into = empty_like(0)
        assert c0.restore(step=1, into=into).tier == "L0" and identical(into, state_at(1, 0))
        # a pending save is settled by a restore (and by the next save), never lost
        c0.save_overlapped(2, state_at(2, 0))
        into = empty_like(0)
        c0.restore(step=2, into=into)
        assert identical(into, state_at(2, 0))
        c0.save_overlapped(3, state_at(3, 0))
        c0.save(4, state_at(4, 0))
        wait_for(lambda: cat.latest_complete_step() == 4, what="step 4 complete")
        into = empty_like(0)
        c0.restore(step=3, into=into)
        assert identical(into, state_at(3, 0))
    cat.close()
