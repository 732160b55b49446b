"""The job's catalog in Redis: sidecar registry, holdings, the latest complete step, recovery plans.

Keys, all namespaced ``lifeline:<job>:``:

=============================  =====================================================================
``sidecar:<rank>``             JSON ``{rank, node, host, port, metrics_port, pid}``; expires after the
                               heartbeat TTL unless refreshed (the registration *is* the heartbeat)
``holders:<step>:<rank>``      set of holdings of rank's shard at step: ``L0@<r>``, ``L1@<r>``
                               (held by rank r's sidecar) or ``L2`` (persisted object)
``meta:<step>:<rank>``         the shard's ``ShardMetadata`` JSON (checksums of every chunk)
``steps``                      sorted set of steps with any holding
``complete``                   the job's latest complete step (advanced only by :data:`_ADVANCE`)
``persisted:<step>``           set of ranks whose blob is in L2; the rank completing it commits
``corrupt``                    list of JSON reports of copies that failed verification
``plan:<generation>``          a recovery plan (JSON) written by the operator/launcher
``generation``                 the job's current generation
=============================  =====================================================================

The latest complete step advances atomically in a Lua script that checks, for every rank, a
holding at the required tier and only ever moves the value forward.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import redis

from lifeline.errors import CatalogError

__all__ = ["Catalog", "TIERS"]

log = logging.getLogger("lifeline.sidecar.catalog")

TIERS = ("L0", "L1", "L2")

# KEYS[1] = complete key; ARGV = step, world_size, tier, prefix. Returns the latest complete step.
_ADVANCE = """
local step = tonumber(ARGV[1])
local world = tonumber(ARGV[2])
local tier = ARGV[3]
local prefix = ARGV[4]
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if step <= cur then return cur end
for r = 0, world - 1 do
  local members = redis.call('SMEMBERS', prefix .. 'holders:' .. step .. ':' .. r)
  local ok = false
  for _, m in ipairs(members) do
    if m == tier or string.sub(m, 1, string.len(tier) + 1) == tier .. '@' then ok = true break end
  end
  if not ok then return cur end
end
redis.call('SET', KEYS[1], step)
return step
"""

# KEYS[1] = persisted:<step>, KEYS[2] = commit lock; ARGV = rank, world. 1 if the caller must commit.
_PERSISTED = """
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  if redis.call('SET', KEYS[2], ARGV[1], 'NX') then return 1 end
end
return 0
"""


class Catalog:
    """A thin, typed client of the job's catalog keys (redis-py; a real Redis server).

    Args:
        url: ``redis://host:port/db``.
        job: TrainingJob name (the key namespace).
        world_size: number of ranks (for completeness checks).

    Every method raises :class:`CatalogError` when Redis is unreachable; callers on the sidecar's
    background threads catch it and resynchronise once Redis is back (:meth:`is_registered`).
    """

    def __init__(self, url: str, job: str, world_size: int) -> None:
        self.job = job
        self.world_size = world_size
        self.prefix = f"lifeline:{job}:"
        self.r = redis.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=5, decode_responses=True
        )
        self._advance = self.r.register_script(_ADVANCE)
        self._persisted = self.r.register_script(_PERSISTED)

    def _k(self, *parts: Any) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as err:
            raise CatalogError(f"Redis catalog unavailable: {err}", job=self.job) from err

    # --- registry and heartbeats ---------------------------------------------------------------
    def register(self, rank: int, info: dict[str, Any], ttl_seconds: float) -> None:
        """Write (or refresh) rank's registration with a TTL: this is the heartbeat."""
        self._call(self.r.set, self._k("sidecar", rank), json.dumps(info), px=int(ttl_seconds * 1000))

    def is_registered(self, rank: int) -> bool:
        """True when rank's registration exists (False after expiry or a Redis restart)."""
        return bool(self._call(self.r.exists, self._k("sidecar", rank)))

    def sidecar(self, rank: int) -> dict[str, Any] | None:
        """Rank's registration (``host``, ``port``, ``node`` ...) or None when not alive."""
        raw = self._call(self.r.get, self._k("sidecar", rank))
        return json.loads(raw) if raw else None

    def sidecars(self) -> dict[int, dict[str, Any]]:
        """Every live registration, by rank."""
        keys = [self._k("sidecar", r) for r in range(self.world_size)]
        vals = self._call(self.r.mget, keys)
        return {r: json.loads(v) for r, v in enumerate(vals) if v}

    # --- holdings ------------------------------------------------------------------------------
    def add_holding(self, step: int, rank: int, holder: str, meta_json: str | None = None) -> None:
        """Record that ``holder`` (``L0@r``, ``L1@r`` or ``L2``) holds a verified copy of (step, rank)."""
        p = self.r.pipeline(transaction=True)
        if meta_json is not None:
            p.set(self._k("meta", step, rank), meta_json)
        p.sadd(self._k("holders", step, rank), holder)
        p.zadd(self._k("steps"), {str(step): step})
        self._call(p.execute)

    def remove_holding(self, step: int, rank: int, holder: str) -> None:
        """Forget ``holder``'s copy of (step, rank) (evicted or found corrupt)."""
        self._call(self.r.srem, self._k("holders", step, rank), holder)

    def holders(self, step: int, rank: int) -> set[str]:
        """The holdings of (step, rank)."""
        return set(self._call(self.r.smembers, self._k("holders", step, rank)))

    def meta(self, step: int, rank: int) -> str | None:
        """The ``ShardMetadata`` JSON of (step, rank), or None when unknown."""
        return self._call(self.r.get, self._k("meta", step, rank))

    def metas(self, step: int) -> list[str | None]:
        """The metadata JSON of every rank at step (None where unknown)."""
        return self._call(self.r.mget, [self._k("meta", step, r) for r in range(self.world_size)])

    def steps(self) -> list[int]:
        """Every step with any recorded holding, ascending."""
        return [int(s) for s in self._call(self.r.zrange, self._k("steps"), 0, -1)]

    # --- the latest complete step --------------------------------------------------------------
    def try_advance(self, step: int, tier: str) -> int:
        """Atomically set the latest complete step to ``step`` if every rank has a holding at ``tier``.

        Never moves the value backwards. Returns the latest complete step after the call (-1: none).
        """
        if tier not in TIERS:
            raise CatalogError(f"unknown tier {tier!r}; expected one of {TIERS}", job=self.job)
        return int(self._call(self._advance, keys=[self._k("complete")], args=[step, self.world_size, tier, self.prefix]))

    def latest_complete_step(self) -> int | None:
        """The job's latest complete step, or None when no checkpoint is complete yet."""
        raw = self._call(self.r.get, self._k("complete"))
        return int(raw) if raw is not None and int(raw) >= 0 else None

    # --- persistence ---------------------------------------------------------------------------
    def mark_persisted(self, step: int, rank: int) -> bool:
        """Record rank's blob of step as persisted; True for exactly one caller once all ranks are."""
        keys = [self._k("persisted", step), self._k("commit", step)]
        return bool(self._call(self._persisted, keys=keys, args=[rank, self.world_size]))

    # --- corruption reports, recovery plans ----------------------------------------------------
    def report_corrupt(self, report: dict[str, Any]) -> None:
        """Append a JSON report of a copy that failed verification (kept for the operator)."""
        self._call(self.r.rpush, self._k("corrupt"), json.dumps(report))

    def corrupt_reports(self) -> list[dict[str, Any]]:
        """Every corruption report so far."""
        return [json.loads(x) for x in self._call(self.r.lrange, self._k("corrupt"), 0, -1)]

    def put_plan(self, generation: int, plan: dict[str, Any]) -> None:
        """Store the recovery plan of ``generation`` and make it the job's current generation."""
        p = self.r.pipeline(transaction=True)
        p.set(self._k("plan", generation), json.dumps(plan))
        p.set(self._k("generation"), generation)
        self._call(p.execute)

    def plan(self, generation: int) -> dict[str, Any] | None:
        """The recovery plan of ``generation``, or None."""
        raw = self._call(self.r.get, self._k("plan", generation))
        return json.loads(raw) if raw else None

    def generation(self) -> int:
        """The job's current generation (0 before the first recovery)."""
        raw = self._call(self.r.get, self._k("generation"))
        return int(raw) if raw else 0

    def forget_step(self, step: int, ranks: Iterable[int]) -> None:
        """Drop every key of step (after garbage collection of all copies)."""
        keys = [self._k("holders", step, r) for r in ranks] + [self._k("meta", step, r) for r in ranks]
        p = self.r.pipeline(transaction=True)
        p.delete(*keys)
        p.zrem(self._k("steps"), str(step))
        self._call(p.execute)

    def close(self) -> None:
        """Close the connection pool."""
        self.r.close()
