-- move_due.lua: scheduler leader moves ONE due task from dtq:retry:schedule into its
-- priority band. Lock check, due check, status check and the move happen in this one
-- script, so a move is atomic and can never happen twice (no dtq:retry:claimed hand-off).
--
-- KEYS[1] dtq:lock:scheduler       (string: the leader's token)
-- KEYS[2] dtq:retry:schedule       (zset: task_id scored by due epoch ms)
-- KEYS[3] dtq:task:<task_id>       (hash: the task record)
-- KEYS[4] dtq:stream:<queue>:p<n>  (band stream of the task; KEYS[4..] are absent when
--                                   the caller could not read the task hash)
-- KEYS[5] dtq:queues:busy           (set: the queue joins it when the task is moved,
--                                   because its streams may have drained meanwhile)
-- KEYS[6] dtq:idempotency:<queue>:<digest> (optional; only when the task has a key)
-- ARGV[1] events channel, ARGV[2] event-id prefix (see _lib.lua)
-- ARGV[3] lock token of the caller
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
--   "not_leader" the lock is not held with this token: nothing done
--   "retry"      hash exists but the caller passed no band stream: nothing done

local lock_key, sched_key, task_key, stream_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, task_id, retention_s = ARGV[3], ARGV[4], tonumber(ARGV[5])

if redis.call('GET', lock_key) ~= token then return 'not_leader' end
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
  idem_update(KEYS[6], task_id, 'failed', now)
  publish('TASK_EXPIRED', now, task_id, queue, task_type, attempt, '',
    {reason = 'deadline_passed', expires_at_ms = expires_at})
  return 'expired'
end

add_entry(stream_key, task_key, attempt)
redis.call('SADD', KEYS[5], queue)
redis.call('HSET', task_key, 'status', 'queued', 'due_at_ms', 0)
keep_live(task_key, now)
publish('TASK_QUEUED', now, task_id, queue, task_type, attempt, '', {reason = 'due'})
return 'moved'
