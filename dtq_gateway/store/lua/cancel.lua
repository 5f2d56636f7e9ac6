-- cancel: cancel a queued or scheduled task, or flag an active one. Every key is of the
-- task's queue (one hash slot); the caller appends the audit entry right after.
-- A queued task's entry is deleted at once when no read has taken it yet, so depth,
-- the depth gate and the backlog age count live tasks only; an entry a lease read
-- already took (the moment before its activation) is left to activate.lua, which
-- acks it away and drops the id from the cancelled set.
-- KEYS[1] task hash  [2] the queue's cancelled set  [3] the queue's schedule zset
-- KEYS[4] the queue's finished index (DTQ_KEEP_FINISHED, see _finished.lua; the task
--         hash again when the record could not be read)
-- KEYS[5] idempotency record or the task hash again (see has_idem)
-- KEYS[6] the task's band stream (its queue and priority; the task hash again when
--         the record could not be read)
-- KEYS[7] the queue's counters hash dtq:queue:{<q>}:counters (the task hash again when
--         the record could not be read): one HINCRBY cancelled when the task ends here,
--         as cancel_matching.lua counts a bulk cancel; an active task is counted by
--         fail.lua or reclaim.lua when it ends, and a task already terminal not again
-- ARGV[3] task id  [4..7] unused (actor, request id, reason, audit MAXLEN)
-- ARGV[8] task retention s  [9] has_idem '1'/'0'  [10] consumer group
-- ARGV[11] DTQ_KEEP_FINISHED ('0' or absent = no count limit)
-- Events: TASK_CANCELLED when the task ends here; TASK_CANCEL_REQUESTED (internal,
-- _lib.lua) when an active task is flagged, so its worker's Lease streams hear of it.
-- Reply: {'cancelled'} | {'requested'} | {'terminal', status} | {'missing'}
local task_key, cancelled_key, schedule_key = KEYS[1], KEYS[2], KEYS[3]
local idem_key = ARGV[9] == '1' and KEYS[5] or nil
local task_id = ARGV[3]
local h = redis.call('HMGET', task_key, 'status', 'queue', 'task_type', 'attempt', 'worker_id',
  'entry_id', 'ckey', 'parked', 'priority', 'idem_digest', 'cancel_requested')
local status = h[1]
if not status then return {'missing'} end
if status ~= 'queued' and status ~= 'scheduled' and status ~= 'active' then
  return {'terminal', status}
end
local now = now_ms()
local reply
if status == 'active' then
  if h[11] ~= '1' then  -- a repeated CancelTask pushes no second notice (the heartbeat
    -- answer lists the lease until its Fail is applied)
    redis.call('HSET', task_key, 'cancel_requested', '1')
    publish_cancel_requested(now, task_id, h[2], h[3], h[4], h[5], h[6], h[9], h[10])
  end
  reply = {'requested'}
else
  if status == 'queued' then
    local stream, entry_id = KEYS[6], h[6]
    local taken = h[8] ~= '1'  -- a parked task has no entry (_concurrency.lua)
    if h[8] == '1' then ckey_unpark_gone(h[2], h[7], h[8], task_key, task_id)
    else ckey_refill(h[2], h[7]) end
    if stream ~= task_key and entry_id and entry_id ~= '' then
      local p = redis.pcall('XPENDING', stream, ARGV[10], entry_id, entry_id, 1)
      taken = type(p) ~= 'table' or p.err ~= nil or #p > 0
    end
    if taken then
      redis.call('SADD', cancelled_key, task_id)  -- activate.lua acks the entry away
    elseif entry_id and entry_id ~= '' then
      redis.call('XDEL', stream, entry_id)
    end
    redis.call('HSET', task_key, 'entry_id', '')
  else
    redis.call('ZREM', schedule_key, task_id)
  end
  redis.call('HSET', task_key, 'status', 'cancelled', 'finished_at_ms', now)
  idem_update(idem_key, task_id, 'failed', now)
  publish('TASK_CANCELLED', now, task_id, h[2], h[3], h[4], '', {stage = status})
  reply = {'cancelled'}
end
if reply[1] == 'cancelled' then
  if KEYS[7] and KEYS[7] ~= task_key then redis.call('HINCRBY', KEYS[7], 'cancelled', 1) end
  retire(task_key, now, tonumber(ARGV[8]))
  if KEYS[4] ~= task_key then keep_finished(KEYS[4], tonumber(ARGV[11]) or 0, {task_id}) end
else keep_live(task_key, now) end
return reply
