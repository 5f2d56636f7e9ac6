-- reclaim.lua: reaper step 2 for ONE entry that autoclaim.lua claimed to the reaper.
-- The lease was lost (worker crashed, hung or partitioned past the visibility
-- timeout), and the lost attempt counts: the task goes back as a new entry with
-- attempt + 1 (TASK_RETRIED), or, on its last attempt, to the dead-letter stream with
-- error class LeaseExpired. The old entry is acked and deleted in the same script, so
-- a reclaim happens at most once per entry and fences out the old lease.
--
-- Every key is of the entry's queue (one hash slot):
-- KEYS[1] dtq:stream:{<queue>}:p<n>  (the entry's band stream; the retry goes here too)
-- KEYS[2] dtq:task:{<tag>}:<task_id>
-- KEYS[3] dtq:stream:{<queue>}:dead-letter
-- KEYS[4] dtq:cancelled:{<queue>}    (set of cancelled task ids)
-- KEYS[5] dtq:queue:{<queue>}:counters (optional): one HINCRBY of cancelled, retried
--         or dead_lettered by the outcome of a lost lease, as fail.lua counts the one a
--         worker reports ("requeued" and "absorbed" count nothing: no attempt ended)
-- KEYS[6] dtq:idempotency:{<queue>}:<digest> (optional; only when the entry has a key)
-- ARGV[1] events channel, ARGV[2] event-id prefix (see _lib.lua)
-- ARGV[3] entry id
-- ARGV[4] the entry's attempt field
-- ARGV[5] dead-letter MAXLEN (approximate, entries)
-- ARGV[6] task retention (s)
-- ARGV[7] consumer group ("workers")
-- ARGV[8] reaper consumer name
--
-- Reply (status string):
--   "not_owned"     the entry is no longer pending on the reaper consumer: nothing done
--   "absorbed"      stale copy (task missing, terminal, or a newer entry/attempt):
--                   acked + deleted, TASK_DUPLICATE_ABSORBED when the task exists
--   "requeued"      read but never activated (status queued, same entry): new entry,
--                   same attempt (it never started), TASK_QUEUED {reason: reclaimed}
--   "cancelled"     cancel was requested while it ran: status cancelled, TASK_CANCELLED
--   "retried"       new entry with attempt + 1, TASK_RETRIED
--   "dead_lettered" last attempt lost: DLQ (LeaseExpired), TASK_DEAD_LETTERED

local stream_key, task_key, dlq_key, cancelled_key, counters_key, idem_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local entry_id, entry_attempt = ARGV[3], tonumber(ARGV[4]) or 0
local dlq_maxlen, retention_s = tonumber(ARGV[5]), tonumber(ARGV[6])
local group, reaper = ARGV[7], ARGV[8]

if not owns(stream_key, group, entry_id, reaper) then return 'not_owned' end

local now = now_ms()
local function drop_entry()
  redis.call('XACK', stream_key, group, entry_id)
  redis.call('XDEL', stream_key, entry_id)
end

local f = redis.call('HMGET', task_key, 'task_id', 'queue', 'task_type', 'status',
  'entry_id', 'attempt', 'max_attempts', 'worker_id', 'started_at_ms', 'cancel_requested',
  'ckey')
local task_id, queue, task_type, status = f[1], f[2], f[3], f[4]
local attempt, max_attempts = tonumber(f[6]) or 0, tonumber(f[7]) or 1
local worker_id = f[8] or ''
local current = status and f[5] == entry_id and attempt == entry_attempt

if current and status == 'queued' then
  drop_entry()
  add_entry(stream_key, task_key, attempt)
  keep_live(task_key, now)
  publish('TASK_QUEUED', now, task_id, queue, task_type, attempt, '',
    {reason = 'reclaimed_unstarted', previous_entry_id = entry_id})
  return 'requeued'
end
if not current or status ~= 'active' then
  drop_entry()
  if not status then return 'absorbed' end
  if status == 'cancelled' then redis.call('SREM', cancelled_key, task_id) end
  publish('TASK_DUPLICATE_ABSORBED', now, task_id, queue, task_type, entry_attempt, '',
    {reason = 'reclaimed_stale_entry', entry_id = entry_id, status = status})
  return 'absorbed'
end

-- The current lease of an active task expired: the attempt counts.
drop_entry()
ckey_release(queue, f[11])  -- every outcome below ends the lease (_concurrency.lua)
local err = 'lease expired'
record_attempt(task_key, attempt, worker_id, f[9], now, 'lease_expired', err, 'LeaseExpired')
redis.call('HSET', task_key, 'last_error', err, 'last_error_class', 'LeaseExpired')
if f[10] == '1' then
  redis.call('HSET', task_key, 'status', 'cancelled', 'finished_at_ms', now, 'entry_id', '')
  redis.call('SREM', cancelled_key, task_id)
  if counters_key then redis.call('HINCRBY', counters_key, 'cancelled', 1) end
  retire(task_key, now, retention_s)
  idem_update(idem_key, task_id, 'failed', now)
  publish('TASK_CANCELLED', now, task_id, queue, task_type, attempt, worker_id,
    {reason = 'lease_expired_while_cancelling'})
  return 'cancelled'
end
if attempt < max_attempts then
  add_entry(stream_key, task_key, attempt + 1)
  redis.call('HSET', task_key, 'status', 'queued', 'worker_id', '')
  if counters_key then redis.call('HINCRBY', counters_key, 'retried', 1) end
  keep_live(task_key, now)
  publish('TASK_RETRIED', now, task_id, queue, task_type, attempt + 1, worker_id,
    {reason = 'lease_expired', lost_attempt = attempt})
  return 'retried'
end
dead_letter(dlq_key, dlq_maxlen, task_key, attempt, now, err, 'LeaseExpired', worker_id)
if counters_key then redis.call('HINCRBY', counters_key, 'dead_lettered', 1) end
retire(task_key, now, retention_s)
idem_update(idem_key, task_id, 'failed', now)
publish('TASK_DEAD_LETTERED', now, task_id, queue, task_type, attempt, worker_id,
  {error_class = 'LeaseExpired', error_message = err})
return 'dead_lettered'
