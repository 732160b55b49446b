"""Unit tests: settings, frames, HMAC handshake, the in-memory store's eviction rules, ring placement."""

from __future__ import annotations

import socket
import threading

import pytest

from lifeline.api.pod import SidecarSettings, TrainerSettings
from lifeline.errors import AuthError, ChecksumError, ConfigError, PeerError
from lifeline.sidecar import frames as _frames
from lifeline.control import place_replicas as place
from lifeline.sidecar.auth import client_handshake, server_handshake
from lifeline.sidecar.store import Holding, Store

SECRET = b"k" * 32


def test_settings_from_environment(monkeypatch, tmp_path):
    env = {"LIFELINE_JOB": "gpt", "LIFELINE_RANK": "3", "LIFELINE_WORLD_SIZE": "4", "LIFELINE_NODE": "node-b",
           "LIFELINE_SECRET": "x" * 20, "LIFELINE_REDIS_URL": "redis://r:6379/0", "LIFELINE_ARENA_DIR": str(tmp_path),
           "LIFELINE_PEER_REPLICAS": "2", "LIFELINE_PERSIST_URI": "s3://b/ckpt", "LIFELINE_PERSIST_EVERY": "10",
           "LIFELINE_S3_SECRET_KEY": "minio-secret", "LIFELINE_BACKPRESSURE": "skip"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = SidecarSettings.load()
    assert (s.job, s.rank, s.world_size, s.node, s.peer_replicas) == ("gpt", 3, 4, "node-b", 2)
    assert s.required_tier == "L1" and s.persist_enabled and s.persist_every == 10
    assert s.socket_path == tmp_path / "sidecar.sock"
    assert s.memory_bytes == 4 * s.slots * s.slot_bytes
    assert "minio-secret" not in repr(s) and "x" * 20 not in repr(s)
    assert TrainerSettings.load().backpressure == "skip"


@pytest.mark.parametrize(
    ("override", "field"),
    [({"rank": 4}, "LIFELINE_RANK"), ({"secret": "short"}, "LIFELINE_SECRET"), ({"slots": 1}, "LIFELINE_SLOTS"),
     ({"peer_replicas": 4}, "LIFELINE_PEER_REPLICAS"), ({"required_tier": "L2"}, "LIFELINE_REQUIRED_TIER")],
)
def test_bad_settings_name_the_variable(override, field):
    base = dict(job="gpt", rank=0, world_size=4, secret="x" * 20, redis_url="redis://r:1/0")
    base.update(override)
    with pytest.raises(ConfigError) as info:
        SidecarSettings.load(**base)
    assert field in str(info.value)
    assert info.value.field == field.removeprefix("LIFELINE_").lower()


def test_frames_roundtrip_and_detect_corruption():
    a, b = socket.socketpair()
    with a, b:
        payload = bytes(range(256)) * 40  # fits the socket buffer
        _frames.send_ctrl(a, {"op": "x", "n": 1})
        _frames.send_data(a, memoryview(payload))
        assert _frames.recv_ctrl(b) == {"op": "x", "n": 1}
        out = bytearray(len(payload))
        assert _frames.recv_data_into(b, memoryview(out)) == len(payload)
        assert out == payload
        # a frame whose bytes changed in transit is rejected
        header = _frames.HEADER.pack(_frames.DATA, _frames.HAS_CRC, _frames.crc32c(payload), len(payload))
        corrupted = bytearray(payload)
        corrupted[5000] ^= 1
        a.sendall(header + corrupted)
        with pytest.raises(ChecksumError):
            _frames.recv_data_into(b, memoryview(bytearray(len(payload))))
        a.close()
        with pytest.raises(PeerError):
            _frames.recv_ctrl(b)


def _handshake(server_secret: bytes, client_secret: bytes, client_job: str = "j"):
    a, b = socket.socketpair()
    result = {}

    def serve():
        try:
            server_handshake(a, secret=server_secret, job="j")
            result["server"] = "ok"
        except AuthError as err:
            result["server"] = err
            a.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        client_handshake(b, secret=client_secret, job=client_job)
        result["client"] = "ok"
    except AuthError as err:
        result["client"] = err
    t.join()
    b.close()
    return result


def test_hmac_handshake_accepts_the_job_secret():
    assert _handshake(SECRET, SECRET) == {"server": "ok", "client": "ok"}


def test_hmac_handshake_refuses_a_wrong_secret_or_job():
    r = _handshake(SECRET, b"w" * 32)
    assert isinstance(r["server"], AuthError) and isinstance(r["client"], AuthError)
    r = _handshake(SECRET, SECRET, client_job="other")
    assert isinstance(r["server"], AuthError) and isinstance(r["client"], AuthError)


def test_missing_secret_gets_nothing_but_the_challenge():
    a, b = socket.socketpair()
    errors = []

    def serve():
        try:
            server_handshake(a, secret=SECRET, job="j")
        except AuthError as err:
            errors.append(err)
        a.close()

    t = threading.Thread(target=serve)
    t.start()
    assert _frames.recv_ctrl(b)["op"] == "challenge"
    _frames.send_ctrl(b, {"op": "auth", "job": "j"})  # no nonce, no MAC
    t.join()
    assert errors and isinstance(errors[0], AuthError)
    assert b.recv(1) == b""  # closed without sending anything else
    b.close()


def _h(step, rank=0, n=100, tier="L0", slot=None, kind="shard"):
    return Holding(kind, step, rank, n, memoryview(bytearray(n)), "{}", tier, slot)


def test_store_keeps_latest_k_and_never_evicts_latest_complete():
    evicted = []
    st = Store(memory_bytes=10_000, on_evict=evicted.append)
    st.latest_complete = 1
    for step in range(1, 6):
        st.add(_h(step), keep=2)
    assert st.steps("shard", 0) == [1, 4, 5]  # 1 is the latest complete: kept beyond K
    assert [h.step for h in evicted] == [2, 3]


def test_store_memory_bound_evicts_oldest_but_not_pinned_or_latest_complete():
    evicted = []
    st = Store(memory_bytes=300, on_evict=evicted.append)
    st.latest_complete = 1
    for step in (1, 2, 3):
        st.add(_h(step, rank=5, tier="L1"))
    pinned = st.pin("shard", 2, 5)
    assert pinned is not None
    assert st.make_room(100)  # evicts step 3? no: oldest evictable is 3 (1 complete, 2 pinned)
    assert [h.step for h in evicted] == [3]
    assert not st.make_room(200)  # 1 (latest complete) and 2 (pinned) cannot go
    st.unpin(pinned)
    assert st.make_room(200) and [h.step for h in evicted] == [3, 2]
    assert st.steps("shard", 5) == [1]


def test_replica_placement_uses_distinct_other_nodes():
    nodes = ["a", "a", "b", "b", "c", "c"]
    p = place(nodes, 2)
    for r, targets in p.items():
        tn = [nodes[t] for t in targets]
        assert nodes[r] not in tn and len(set(tn)) == 2
    with pytest.raises(ConfigError):
        place(["a", "b"], 2)
