"""Redis AUTH and per-job ACL users against a real redis-server (docs/security.md): no password is
refused, a job's user reaches only its own keys (also from Lua), admin commands are denied, the
user is re-granted after a Redis restart, and `lifeline run`'s services come up locked the same way."""

from __future__ import annotations

import pytest
import redis
import yaml

from lifeline.api.load import load_trainingjob
from lifeline.catalog import Catalog, job_user
from lifeline.devcluster.services import RedisServer
from lifeline.errors import CatalogError
from lifeline.launch.services import start_services

ADMIN = "admin-" + "x" * 40
PASSWORDS = {"job-a": "a" * 40, "job-b": "b" * 40}


@pytest.fixture
def locked_redis(tmp_path):
    """A fresh redis-server with a password; job-a and job-b have their ACL users and some keys."""
    with RedisServer(state_dir=tmp_path / "redis", password=ADMIN) as server:
        for job, password in PASSWORDS.items():
            admin = Catalog(server.url, job, 1, username="", password=ADMIN)
            assert admin.grant_job_user(password) == job_user(job) == f"lifeline-job-{job}"
            admin.add_holding(3, 0, "L0", 0, '{"job": "%s"}' % job)
            admin.close()
        yield server


def _as(server: RedisServer, job: str, *, user_of: str | None = None, password: str | None = None) -> Catalog:
    owner = user_of or job
    return Catalog(server.url, job, 1, username=job_user(owner), password=password or PASSWORDS[owner])


def test_no_password_or_a_wrong_one_is_refused(locked_redis):
    for username, password in (("", ""), ("", "wrong-password-000000"), (job_user("job-a"), "b" * 40)):
        catalog = Catalog(locked_redis.url, "job-a", 1, username=username, password=password)
        with pytest.raises(CatalogError, match="(?i)auth|NOAUTH|password|HELLO"):
            catalog.holder_names(3, 0)
        catalog.close()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(locked_redis.url).get("lifeline:job-a:steps")


def test_a_jobs_user_reaches_its_keys_and_not_another_jobs(locked_redis):
    own = _as(locked_redis, "job-a")
    assert own.holder_names(3, 0) == {"L0@0"} and own.meta(3, 0) == '{"job": "job-a"}'
    assert own.try_advance(3, "L0", rank=0) == 3  # the Lua script touches only job-a's keys
    own.add_holding(4, 0, "L0", 0)
    own.close()
    other = _as(locked_redis, "job-b", user_of="job-a")  # job-a's credentials, job-b's key names
    for read in (lambda: other.meta(3, 0), lambda: other.holder_names(3, 0), lambda: other.try_advance(3, "L0", rank=0),
                 lambda: other.add_holding(5, 0, "L0", 0), other.wipe):
        with pytest.raises(CatalogError, match="(?i)no permissions"):
            read()
    other.close()
    admin = Catalog(locked_redis.url, "job-b", 1, username="", password=ADMIN)
    assert admin.meta(3, 0) == '{"job": "job-b"}' and admin.holder_names(5, 0) == frozenset()  # untouched
    admin.close()


def test_a_jobs_user_cannot_run_admin_or_unscoped_commands(locked_redis):
    r = redis.Redis.from_url(locked_redis.url, username=job_user("job-a"), password=PASSWORDS["job-a"])
    for cmd in (("KEYS", "*"), ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "requirepass"), ("ACL", "LIST"),
                ("SCRIPT", "FLUSH"), ("SHUTDOWN",), ("DEBUG", "SLEEP", "0")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*cmd)
    with pytest.raises(redis.exceptions.ResponseError, match="(?i)can't access|no permissions"):
        r.eval("return redis.call('GET', 'lifeline:job-b:meta:3:0')", 0)  # a key named inside Lua
    r.close()


def test_regrant_restores_a_user_lost_with_a_redis_restart_and_keeps_connections(locked_redis):
    own = _as(locked_redis, "job-a")
    assert own.holder_names(3, 0) == {"L0@0"}
    admin = Catalog(locked_redis.url, "job-a", 1, username="", password=ADMIN)
    admin.grant_job_user(PASSWORDS["job-a"])  # every reconcile does this: idempotent
    assert own.holder_names(3, 0) == {"L0@0"}  # the open connection survives the reset
    admin.revoke_job_user()  # what a restarted Redis (ACLs not persisted) looks like
    fresh = _as(locked_redis, "job-a")
    with pytest.raises(CatalogError):
        fresh.ping()
    admin.grant_job_user(PASSWORDS["job-a"])
    fresh.ping()
    for c in (own, admin, fresh):
        c.close()
    with pytest.raises(ValueError, match="16 characters"):
        Catalog(locked_redis.url, "job-a", 1, username="", password=ADMIN).grant_job_user("short")


def test_lifeline_run_services_require_auth_and_give_the_job_its_own_user(tmp_path, job_body):
    body = yaml.safe_load(yaml.safe_dump(job_body))
    body["spec"]["checkpoint"].pop("persist", None)
    job = load_trainingjob(body)
    services = start_services(job, tmp_path / "state")
    try:
        assert len(services.redis_password) >= 32 and services.redis_job_username == "lifeline-job-gpt-moe"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(services.redis_url).ping()
        admin = services.catalog("gpt-moe", 1)
        admin.add_holding(1, 0, "L0", 0)
        ranks = Catalog(services.redis_url, "gpt-moe", 1, username=services.redis_job_username,
                        password=services.redis_job_password)
        assert ranks.holder_names(1, 0) == {"L0@0"}
        stranger = Catalog(services.redis_url, "other", 1, username=services.redis_job_username,
                           password=services.redis_job_password)
        with pytest.raises(CatalogError, match="(?i)no permissions"):
            stranger.holder_names(1, 0)
        for c in (admin, ranks, stranger):
            c.close()
    finally:
        services.stop()
