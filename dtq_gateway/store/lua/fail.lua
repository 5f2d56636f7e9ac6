-- fail: report a failed, released or cancelled lease (fenced).
-- All keys are of the task's queue (one hash slot):
-- KEYS[1] band stream  [2] task hash  [3] the queue's dead-letter stream
-- KEYS[4] the queue's schedule zset
-- KEYS[5] idempotency record or the task hash again (see has_idem)
-- KEYS[6] (optional) the queue's counters hash dtq:queue:{<q>}:counters: one HINCRBY of
--         retried, dead_lettered or cancelled by the outcome (a release counts nothing)
-- ARGV[3] group  [4] entry id  [5] attempt  [6] worker id  [7] task id
-- ARGV[8] mode: 'failure' | 'release' | 'cancelled'  [9] retryable '1'/'0'
-- ARGV[10] retry_after_ms (0 = backoff)  [11] jitter u in [0,1)  [12] error message
-- ARGV[13] error class  [14] dead-letter MAXLEN (~)  [15] task retention s  [16] has_idem
-- ARGV[17] lease tag (see current_lease in _lib.lua)
-- Reply: {'retry', status, started_at_ms, due_at_ms, group} | {'dead', ...}
--        | {'released', ...} | {'cancelled', ...} | {'dup', status} | {'stale', status};
--        group: 'g' when the task is a group member (followups.py records a terminal
--        member's outcome), else ''; then unparked: tasks of the lease's concurrency key
--        moved back to their band (0 or 1, _concurrency.lua)
-- Backoff: delay = floor(u * min(cap, base * 2^(attempt-1))) ("full jitter"),
-- base/cap from the task record; retry_after_ms from the worker wins.
local stream, task_key, dlq_key, schedule_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local idem_key = ARGV[16] == '1' and KEYS[5] or nil
local group, id, attempt, worker, task_id = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
local mode, err, err_class = ARGV[8], ARGV[12], ARGV[13]
local h, status = current_lease(task_key, id, worker, attempt, ARGV[17],
  {'started_at_ms', 'max_attempts', 'backoff_base_ms', 'backoff_cap_ms', 'cancel_requested',
   'task_type', 'follow', 'ckey'})
if not h then
  if finished_by(task_key, id, 'fail', attempt, worker) then return {'dup', status} end
  return {'stale', status or 'missing'}
end
local started, queue, task_type = h[8], h[5], h[13]
local now = now_ms()
local retention = tonumber(ARGV[15])
redis.call('XACK', stream, group, id)
redis.call('XDEL', stream, id)
redis.call('HSET', task_key, 'entry_id', '', 'done', 'fail:' .. id)
-- every outcome below ends the lease: free its concurrency key's slot (_concurrency.lua)
local unparked = ckey_release(queue, h[15])

local COUNTED = {retry = 'retried', dead = 'dead_lettered', cancelled = 'cancelled'}
-- terminal outcomes start the retention clock; a retry or release stays live
local function finish(kind, new_status, extra)
  local field = COUNTED[kind]
  if field and KEYS[6] then redis.call('HINCRBY', KEYS[6], field, 1) end
  if new_status == 'scheduled' or new_status == 'queued' then keep_live(task_key, now)
  else retire(task_key, now, retention) end
  local member = ''
  if h[14] and string.find(h[14], 'g', 1, true) then member = 'g' end
  return {kind, new_status, started, extra or 0, member, unparked}
end

if h[12] == '1' then
  -- cancellation was requested: whatever the handler reported, the task ends cancelled
  redis.call('HSET', task_key, 'status', 'cancelled', 'finished_at_ms', now)
  record_attempt(task_key, attempt, worker, started, now, 'cancelled', err, err_class)
  idem_update(idem_key, task_id, 'failed', now)
  publish('TASK_CANCELLED', now, task_id, queue, task_type, attempt, worker, {stage = 'running'})
  return finish('cancelled', 'cancelled')
end

if mode == 'release' then
  record_attempt(task_key, attempt, worker, started, now, 'released', '', '')
  redis.call('HSET', task_key, 'status', 'queued', 'worker_id', '')
  add_entry(stream, task_key, attempt)
  publish('TASK_QUEUED', now, task_id, queue, task_type, attempt, worker, {reason = 'released'})
  return finish('released', 'queued')
end

record_attempt(task_key, attempt, worker, started, now, 'failed', err, err_class)
redis.call('HSET', task_key, 'last_error', err, 'last_error_class', err_class)
publish('TASK_FAILED', now, task_id, queue, task_type, attempt, worker,
  {error = string.sub(err, 1, 512), error_class = err_class})

if ARGV[9] == '1' and attempt < tonumber(h[9]) then
  local delay = tonumber(ARGV[10])
  if delay <= 0 then
    local ceiling = math.min(tonumber(h[11]), tonumber(h[10]) * 2 ^ (attempt - 1))
    delay = math.floor(tonumber(ARGV[11]) * ceiling)
  end
  local due = now + delay
  redis.call('HSET', task_key, 'status', 'scheduled', 'attempt', attempt + 1, 'due_at_ms', due)
  redis.call('ZADD', schedule_key, due, task_id)
  publish('TASK_RETRY_SCHEDULED', now, task_id, queue, task_type, attempt, worker,
    {delay_ms = delay, next_attempt = attempt + 1})
  return finish('retry', 'scheduled', due)
end

dead_letter(dlq_key, ARGV[14], task_key, attempt, now, err, err_class, worker)
idem_update(idem_key, task_id, 'failed', now)
publish('TASK_DEAD_LETTERED', now, task_id, queue, task_type, attempt, worker,
  {error_class = err_class})
return finish('dead', 'dead_lettered')
