-- worker_sweep.lua: stale-worker check of ONE member of dtq:workers (scheduler leader).
-- WORKER_STALE is published at most once per staleness: the SREM or the status flip
-- that precedes it happens in this same script.
--
-- KEYS[1] dtq:workers            (set of known worker ids)
-- KEYS[2] dtq:worker:<worker_id> (liveness hash; expires 3x the heartbeat interval)
-- ARGV[1] events channel, ARGV[2] event-id prefix (see _lib.lua)
-- ARGV[3] worker_id
-- ARGV[4] stale after (ms): a heartbeat older than this marks the worker stale
--
-- Reply (status string):
--   "removed"  the hash expired: member removed, WORKER_STALE {reason: expired}
--   "stale"    status was alive and last_heartbeat is too old: status stale, WORKER_STALE
--   "forgotten" status stopped (said goodbye with WORKER_STOPPED) and last_heartbeat too
--              old: member removed silently, so its later expiry is not reported stale
--   "ok"       nothing to do (fresh, already stale, or already removed)

local set_key, worker_key, worker_id = KEYS[1], KEYS[2], ARGV[3]
local stale_after_ms = tonumber(ARGV[4])
local now = now_ms()

if redis.call('EXISTS', worker_key) == 0 then
  if redis.call('SREM', set_key, worker_id) == 1 then
    publish('WORKER_STALE', now, '', '', '', 0, worker_id, {reason = 'expired'})
    return 'removed'
  end
  return 'ok'
end
local f = redis.call('HMGET', worker_key, 'status', 'last_heartbeat')
local last = tonumber(f[2]) or 0
if f[1] == 'alive' and now - last > stale_after_ms then
  redis.call('HSET', worker_key, 'status', 'stale')
  publish('WORKER_STALE', now, '', '', '', 0, worker_id,
    {reason = 'heartbeat_overdue', last_heartbeat_ms = last, age_ms = now - last})
  return 'stale'
end
if (f[1] == 'stopped' or f[1] == 'draining') and now - last > stale_after_ms then
  redis.call('SREM', set_key, worker_id)
  return 'forgotten'
end
return 'ok'
