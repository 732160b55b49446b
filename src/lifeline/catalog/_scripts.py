"""The catalog's Lua scripts: the only multi-key updates that must be atomic."""

from __future__ import annotations

__all__ = ["ADVANCE", "PERSISTED", "SPARE", "RELEASE", "PUT_PLAN"]

ADVANCE = """
-- KEYS[1] = complete key; ARGV = step, world_size, tier, holders prefix. Returns the latest complete step.
local step = tonumber(ARGV[1])
local world = tonumber(ARGV[2])
local tier = ARGV[3]
local prefix = ARGV[4]
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if step <= cur then return cur end
for r = 0, world - 1 do
  local members = redis.call('SMEMBERS', prefix .. step .. ':' .. r)
  local ok = false
  for _, m in ipairs(members) do
    if m == tier or string.sub(m, 1, string.len(tier) + 1) == tier .. '@' then ok = true break end
  end
  if not ok then return cur end
end
redis.call('SET', KEYS[1], step)
return step
"""
"""Advance the latest complete step to ARGV[1] when every rank holds a copy at the tier; never backwards."""

PERSISTED = """
-- KEYS[1] = persisted:<step>, KEYS[2] = commit:<step>; ARGV = rank, world. 1 if the caller must commit.
-- The claim is kept by rank: the claimant asking again (a retry after a failed commit, or its restarted
-- sidecar persisting the step again) gets 1 again, so a commit interrupted after the claim is redone.
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  if redis.call('SET', KEYS[2], ARGV[1], 'NX') then return 1 end
  if redis.call('GET', KEYS[2]) == ARGV[1] then return 1 end
end
return 0
"""
"""Record a rank's blob as persisted; exactly one rank learns it completes the set and commits (again on
its retries)."""

SPARE = """
-- KEYS[1] = spared; ARGV = step, ttl (ms), then (holders key, member) pairs. 1 when every member is still
-- recorded (then the step is spared for ttl ms), else 0 (nothing changed).
for i = 3, #ARGV, 2 do
  if redis.call('SISMEMBER', ARGV[i], ARGV[i + 1]) == 0 then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
"""Spare a step in sidecar memory when every copy a plan reads is still recorded (one atomic check-and-set)."""

RELEASE = """
-- KEYS[1] = spared, KEYS[2] = holders:<step>:<rank>, KEYS[3] = held:<holder>; ARGV = step, member, index
-- entry. 1: forgotten (the sidecar may evict it); 0: the step is spared (the sidecar keeps it).
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[3])
return 1
"""
"""Forget a memory copy before it is evicted, unless its step is spared. Ordered against :data:`SPARE` by
Redis: a copy forgotten first makes the spare fail (the planner sees it gone); a spare set first keeps it."""

PUT_PLAN = """
-- KEYS[1] = plan:<generation>, KEYS[2] = generation; ARGV = generation, plan JSON, holders prefix, held
-- prefix, then the ranks whose sidecars' memory died. Returns how many holdings were forgotten. They are
-- forgotten only when the plan advances the stored generation (or is the first plan): a plan stored again
-- (a Redis restart, a retried write) leaves the copies that the replaced sidecars registered since
-- untouched. Each dead sidecar's copies are read from its reverse index held:<h> (O(copies it held)).
local g = tonumber(ARGV[1])
local cur = redis.call('GET', KEYS[2])
local dropped = 0
if (cur and tonumber(cur) < g) or (not cur and g == 1) then
  for i = 5, #ARGV do
    local held = ARGV[4] .. ARGV[i]
    for _, entry in ipairs(redis.call('ZRANGE', held, 0, -1)) do
      local step, rank, tier = string.match(entry, '^(-?%d+):(%d+):(L[01])$')
      if step then
        dropped = dropped + redis.call('SREM', ARGV[3] .. step .. ':' .. rank, tier .. '@' .. ARGV[i])
      end
    end
    redis.call('DEL', held)
  end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return dropped
"""
"""Store a plan and make its generation current, forgetting (atomically, before any replacement sidecar
can register) the memory copies that died with the failures it answers."""
