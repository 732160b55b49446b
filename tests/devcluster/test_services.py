"""Real Redis and MinIO servers started by the shared fixtures: write/read round trips."""

from __future__ import annotations

import io
import os

import redis
from minio import Minio

from lifeline.devcluster.services import RedisServer


def test_redis_round_trip(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    payload = os.urandom(4096)
    client.set("lifeline:test:blob", payload)
    assert client.get("lifeline:test:blob") == payload
    assert redis_server.url.startswith("redis://127.0.0.1:")


def test_minio_round_trip(minio_server):
    client = Minio(minio_server.endpoint, access_key=minio_server.access_key,
                   secret_key=minio_server.secret_key, secure=False)
    client.make_bucket("roundtrip")
    payload = os.urandom(1 << 20)
    client.put_object("roundtrip", "a/b.bin", io.BytesIO(payload), len(payload))
    assert client.get_object("roundtrip", "a/b.bin").read() == payload
    client.remove_object("roundtrip", "a/b.bin")
    client.remove_bucket("roundtrip")


def test_stop_removes_process_and_temp_dir():
    server = RedisServer().start()
    pid, state = server.pid, server.state_dir
    assert state.is_dir()
    server.stop()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert not state.exists()
