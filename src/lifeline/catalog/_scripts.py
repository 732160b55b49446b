"""The catalog's Lua scripts: the only multi-key updates that must be atomic."""

from __future__ import annotations

__all__ = ["ADVANCE", "RESTORE_COMPLETE", "PERSISTED", "SPARE", "RELEASE", "PUT_PLAN", "RECORD_LOG", "PRUNE"]

ADVANCE = """
-- KEYS[1] = complete, KEYS[2] = complete:floors; ARGV = world_size, tier, holders prefix, rank, floor,
-- then the steps to try, newest first. Returns the latest complete step after the call (-1: none).
local world = tonumber(ARGV[1])
local tier = ARGV[2]
local prefix = ARGV[3]
local rank = ARGV[4]
local floor = tonumber(ARGV[5])
local raw = redis.call('GET', KEYS[1])
local cur = tonumber(raw or '-1')
local derived = -1
for i = 6, #ARGV do
  local step = tonumber(ARGV[i])
  if step <= cur then break end
  local all = true
  for r = 0, world - 1 do
    local ok = false
    for _, m in ipairs(redis.call('SMEMBERS', prefix .. step .. ':' .. r)) do
      if m == tier or string.sub(m, 1, string.len(tier) + 1) == tier .. '@' then ok = true break end
    end
    if not ok then all = false break end
  end
  if all then derived = step break end
end
if raw then
  if derived > cur then redis.call('SET', KEYS[1], derived) return derived end
  return cur
end
-- no complete step on record: a new job, or a Redis that restarted empty. The step is set only once
-- every rank has spoken, to the highest of what each derived or had seen complete before (its floor),
-- so a rank with a stale view never publishes an older step than another rank saw.
redis.call('HSET', KEYS[2], rank, math.max(floor, derived))
local best = -1
for r = 0, world - 1 do
  local v = redis.call('HGET', KEYS[2], tostring(r))
  if not v then return -1 end
  best = math.max(best, tonumber(v))
end
if best < 0 then return -1 end
redis.call('SET', KEYS[1], best)
redis.call('DEL', KEYS[2])
return best
"""
"""Advance the latest complete step to the newest of the given steps that every rank holds at the tier;
never backwards. While no step is recorded (a new job, or Redis restarted empty), each rank's call
records ``max(floor, derived)`` and the step is set once every rank below the world size has called."""

RESTORE_COMPLETE = """
-- KEYS[1] = complete, KEYS[2] = complete:floors; ARGV[1] = step. Returns the latest complete step after.
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
local step = tonumber(ARGV[1])
if step > cur then
  redis.call('SET', KEYS[1], step)
  redis.call('DEL', KEYS[2])
  return step
end
return cur
"""
"""Raise the latest complete step to a step known complete before (never lowers it); the floors a
restarted Redis was collecting are dropped, the step being set."""

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
-- KEYS[1] = plan:<generation>, KEYS[2] = generation, KEYS[3] = logs, KEYS[4] = logs:gone, KEYS[5] =
-- logs:floor; ARGV = generation, plan JSON, holders prefix, held prefix, then the ranks whose sidecars'
-- memory died. Returns how many holdings were forgotten. They are forgotten only when the plan advances
-- the stored generation (or is the first plan): a plan stored again (a Redis restart, a retried write)
-- leaves the copies that the replaced sidecars registered since untouched. Each dead sidecar's copies are
-- read from its reverse index held:<h> (O(copies it held)).
--
-- Upstream logs (fuzz seed 3089): a dead sidecar held the originals of its rank's log and the replicas
-- of other ranks' logs. logs:gone keeps, per logging rank k, two prefixes: o:<k>, the steps whose
-- originals died (k's sidecar died), and r:<k>, the steps whose replica may have died (any other
-- sidecar died: the holder of k's replica is not known here, so any death counts). Steps up to the lower
-- of the two have no copy left: that is k's floor (logs:floor), and k's coverage starts after it. A log
-- kept without replicas (replicas 0) loses everything with its sidecar.
local g = tonumber(ARGV[1])
local cur = redis.call('GET', KEYS[2])
local dropped = 0
local function mark(field, step)
  local old = tonumber(redis.call('HGET', KEYS[4], field) or '-1')
  if step > old then redis.call('HSET', KEYS[4], field, step) return step end
  return old
end
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
    local logs = redis.call('HGETALL', KEYS[3])
    for j = 1, #logs, 2 do
      local k = logs[j]
      local ok, doc = pcall(cjson.decode, logs[j + 1])
      if ok and type(doc) == 'table' and tonumber(doc['first']) and tonumber(doc['last']) then
        local last = tonumber(doc['last'])
        local o, r
        if k == ARGV[i] then
          o = mark('o:' .. k, last)
          r = tonumber(redis.call('HGET', KEYS[4], 'r:' .. k) or '-1')
          if tonumber(doc['replicas'] or 1) == 0 then r = last end
        else
          o = tonumber(redis.call('HGET', KEYS[4], 'o:' .. k) or '-1')
          r = mark('r:' .. k, last)
        end
        local floor = math.max(math.min(o, r), tonumber(redis.call('HGET', KEYS[5], k) or '-1'))
        if floor >= 0 then
          redis.call('HSET', KEYS[5], k, floor)
          local first = math.max(tonumber(doc['first']), floor + 1)
          if first > last then
            redis.call('HDEL', KEYS[3], k)
          else
            redis.call('HSET', KEYS[3], k, cjson.encode({first = first, last = last,
                                                         replicas = tonumber(doc['replicas'] or 1)}))
          end
        end
      end
    end
  end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return dropped
"""
"""Store a plan and make its generation current, forgetting (atomically, before any replacement sidecar
can register) the memory copies that died with the failures it answers."""

RECORD_LOG = """
-- KEYS[1] = logs, KEYS[2] = logs:floor; ARGV = rank, first, last, replicas. Records the rank's coverage,
-- starting after its floor (PUT_PLAN): a trainer that kept running through a plan still counts from the
-- first step it logged, which may have died since. 1: recorded; 0: nothing above the floor (deleted).
local floor = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1')
local first = math.max(tonumber(ARGV[2]), floor + 1)
local last = tonumber(ARGV[3])
if first > last then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({first = first, last = last, replicas = tonumber(ARGV[4])}))
return 1
"""
"""Record a rank's upstream-log coverage above the floor the plans left it (steps of its log that died)."""

PRUNE = """
-- KEYS[1] = steps, KEYS[2] = pruned (the newest step examined so far); ARGV = horizon, key prefix, batch.
-- Examines, oldest first, at most batch steps newer than the cursor and older than the newest step minus
-- horizon; a step none of whose filed ranks has a copy left (holders:<step>:<r> gone: every memory copy
-- released, no L2 copy) loses its metadata, its filed set and its entry in steps. Returns how many.
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then return 0 end
local before = tonumber(newest[2]) - tonumber(ARGV[1])
local from = tonumber(redis.call('GET', KEYS[2]) or '-1')
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. from, '(' .. before, 'WITHSCORES', 'LIMIT', 0,
                       tonumber(ARGV[3]))
local pruned = 0
for i = 1, #old, 2 do
  local step = old[i]
  local filed = ARGV[2] .. 'filed:' .. step
  local ranks = redis.call('SMEMBERS', filed)
  local live = false
  for _, r in ipairs(ranks) do
    if redis.call('EXISTS', ARGV[2] .. 'holders:' .. step .. ':' .. r) == 1 then live = true break end
  end
  if not live then
    for _, r in ipairs(ranks) do redis.call('DEL', ARGV[2] .. 'meta:' .. step .. ':' .. r) end
    redis.call('DEL', filed)
    redis.call('ZREM', KEYS[1], step)
    pruned = pruned + 1
  end
  redis.call('SET', KEYS[2], old[i + 1])
end
return pruned
"""
"""Forget the steps that no copy is left of, past a horizon of recent steps (their metadata kept for
verified replay): the catalog stays bounded by the horizon plus the steps still held (L2)."""
