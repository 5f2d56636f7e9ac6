-- expire_waiting.lua: the scheduler leader expires ONE waiting task whose expiry passed
-- before any worker started it, so that depth, backlog age, the depth gate and every
-- consumer of them (GetQueueStats, the metrics, the KEDA scaler) count live work only.
-- Without it such a task would sit in its band until a lease read found it.
-- Checks and the expiry happen in this one script (the queue's slot), so a task is
-- expired once, whoever calls it, and never after a worker started it.
--
-- KEYS[1] dtq:expiring:{<queue>}        (zset: task_id scored by expires_at_ms)
-- KEYS[2] dtq:task:{<tag>}:<task_id>    (hash: the task record)
-- KEYS[3] dtq:stream:{<queue>}:p<n>     (band stream of the task; KEYS[3..] are absent
--                                       when the caller could not read the task hash)
-- KEYS[4] dtq:idempotency:{<queue>}:<digest> (optional; only when the task has a key)
-- ARGV[1] events channel, ARGV[2] event-id prefix (see _lib.lua)
-- ARGV[3] task_id  ARGV[4] task retention (s): EXPIRE of the expired record
-- ARGV[5] consumer group
--
-- Reply (status string):
--   "expired"  entry deleted from its band, status expired, TASK_EXPIRED
--              {reason: deadline_passed}, idempotency failed, member removed
--   "reading"  a lease read already took the entry (it is pending): activate.lua
--              expires it; nothing done
--   "gone"     task hash missing (retention ran out): member removed
--   "skipped"  not waiting any more (started, cancelled, ended) or no expiry: member removed
--   "not_due"  not in the index, or its expiry is still in the future: nothing done
--   "retry"    hash exists but the caller passed no band stream: nothing done

local index_key, task_key, stream_key = KEYS[1], KEYS[2], KEYS[3]
local task_id, retention_s, group = ARGV[3], tonumber(ARGV[4]), ARGV[5]

local now = now_ms()
local score = redis.call('ZSCORE', index_key, task_id)
if not score or tonumber(score) > now then return 'not_due' end

local f = redis.call('HMGET', task_key, 'status', 'queue', 'task_type', 'attempt',
  'expires_at_ms', 'started_at_ms', 'entry_id', 'ckey', 'parked')
if not f[1] then
  redis.call('ZREM', index_key, task_id)
  return 'gone'
end
local expires_at = tonumber(f[5]) or 0
if f[1] ~= 'queued' or (tonumber(f[6]) or 0) > 0 or expires_at <= 0 then
  redis.call('ZREM', index_key, task_id)
  return 'skipped'
end
if now < expires_at then
  redis.call('ZADD', index_key, expires_at, task_id)  -- the index was early: re-score
  return 'not_due'
end
if not stream_key then return 'retry' end

local entry_id = f[7]
if entry_id and entry_id ~= '' then
  local pending = redis.pcall('XPENDING', stream_key, group, entry_id, entry_id, 1)
  if type(pending) == 'table' and not pending.err and #pending > 0 then
    return 'reading'
  end
  redis.call('XDEL', stream_key, entry_id)
end
redis.call('ZREM', index_key, task_id)
if f[9] == '1' then ckey_unpark_gone(f[2], f[8], f[9], task_key, task_id)
else ckey_refill(f[2], f[8]) end
redis.call('HSET', task_key, 'status', 'expired', 'finished_at_ms', now, 'entry_id', '')
retire(task_key, now, retention_s)
idem_update(KEYS[4], task_id, 'failed', now)
publish('TASK_EXPIRED', now, task_id, f[2], f[3], tonumber(f[4]) or 1, '',
  {reason = 'deadline_passed', expires_at_ms = expires_at})
return 'expired'
