-- move_due.lua: the scheduler leader moves ONE due task from its queue's schedule into
-- its priority band. Due check, status check and the move happen in this one script,
-- so a move is atomic and can never happen twice, whoever calls it (no lock check: the
-- lock lives in another hash slot, and a second mover finds the member gone).
-- The queue stays busy throughout (its schedule held the task until this step), so
-- its busy marker needs no update.
--
-- KEYS[1] dtq:retry:{<queue>}:schedule  (zset: task_id scored by due epoch ms)
-- KEYS[2] dtq:task:{<tag>}:<task_id>    (hash: the task record)
-- KEYS[3] dtq:stream:{<queue>}:p<n>     (band stream of the task; KEYS[3..] are absent
--                                       when the caller could not read the task hash)
-- KEYS[4] dtq:expiring:{<queue>}        (zset: expiry index of waiting tasks)
-- KEYS[5] dtq:idempotency:{<queue>}:<digest> (optional; only when the task has a key)
-- ARGV[1] events channel, ARGV[2] event-id prefix (see _lib.lua)
-- ARGV[3] unused (was the lock token)
-- ARGV[4] task_id
-- ARGV[5] task retention (s): EXPIRE of the task hash
--
-- Reply (status string):
--   "moved"      XADDed into the band, status queued, TASK_QUEUED {reason: due}
--   "expired"    expires_at_ms passed before any start: status expired, TASK_EXPIRED,
--                idempotency failed (a task that started follows its retry policy)
--   "gone"       task hash missing (retention ran out): schedule member removed
--   "skipped"    task not in status scheduled (cancelled, moved elsewhere): member removed
--   "not_due"    not in the schedule, or its score is still in the future: nothing done
--   "retry"      hash exists but the caller passed no band stream: nothing done

local sched_key, task_key, stream_key = KEYS[1], KEYS[2], KEYS[3]
local task_id, retention_s = ARGV[4], tonumber(ARGV[5])

local now = now_ms()
local score = redis.call('ZSCORE', sched_key, task_id)
if not score or tonumber(score) > now then return 'not_due' end

if redis.call('EXISTS', task_key) == 0 then
  redis.call('ZREM', sched_key, task_id)
  return 'gone'
end
local f = redis.call('HMGET', task_key, 'status', 'queue', 'task_type', 'attempt',
  'expires_at_ms', 'started_at_ms')
if f[1] ~= 'scheduled' then
  redis.call('ZREM', sched_key, task_id)
  return 'skipped'
end
if not stream_key then return 'retry' end

local queue, task_type, attempt = f[2], f[3], tonumber(f[4]) or 1
local expires_at = tonumber(f[5]) or 0
redis.call('ZREM', sched_key, task_id)
-- expiry means "not started by": a retry waiting for its backoff never expires
if expires_at > 0 and now >= expires_at and (tonumber(f[6]) or 0) == 0 then
  redis.call('HSET', task_key, 'status', 'expired', 'finished_at_ms', now, 'due_at_ms', 0)
  retire(task_key, now, retention_s)
  idem_update(KEYS[5], task_id, 'failed', now)
  publish('TASK_EXPIRED', now, task_id, queue, task_type, attempt, '',
    {reason = 'deadline_passed', expires_at_ms = expires_at})
  return 'expired'
end

add_entry(stream_key, task_key, attempt)
redis.call('HSET', task_key, 'status', 'queued', 'due_at_ms', 0)
if expires_at > 0 and (tonumber(f[6]) or 0) == 0 then
  redis.call('ZADD', KEYS[4], expires_at, task_id)  -- expire_waiting.lua's index
end
keep_live(task_key, now)
publish('TASK_QUEUED', now, task_id, queue, task_type, attempt, '', {reason = 'due'})
return 'moved'
