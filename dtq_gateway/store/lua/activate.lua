-- activate: turn entries just read by lease_read into active leases, or absorb them.
-- Per activated entry: one HMGET (the fencing read) and one HSET; no TTL (a live record
-- has none, see retire() in _lib.lua) and one events message per call.
-- Every entry of one call is of ONE queue (one hash slot; the dispatcher calls once per
-- queue).
-- KEYS[1]   the queue's cancelled set dtq:cancelled:{<queue>}
-- per entry i (3 keys): band stream, task hash, idempotency record (or the task hash
--           again when the task has no idempotency key)
-- KEYS[#KEYS] the queue's expiry index dtq:expiring:{<queue>}: a task with an expiry
--           leaves it when it starts or expires here
-- ARGV[3] consumer (worker id)  [4] task retention s  [5] group
-- per entry i (5 args from ARGV[6]): entry id, task id, entry attempt, mode, queued at
--   mode 'a' = activate, 'r' = put back at the tail (task type not wanted by the session)
--   queued at: epoch ms the task began to wait (the entry's queued_at field, else its id
--   time); the put-back entry carries it as queued_at, and so does the entry a parked
--   task gets back
-- Reply per entry: {'ok', content_type, metadata JSON, created_at_ms, leased_at_ms}
--   | {'absorbed'} | {'cancelled'} | {'expired'} | {'requeued'}
--   | {'parked'} (its concurrency key is at the queue's limit: _concurrency.lua)
local consumer, retention, group = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local out = {}
local n = (#KEYS - 2) / 3
local expiring_key = KEYS[#KEYS]

local function drop(stream, id)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
end

for i = 1, n do
  local stream, task_key, idem_key = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  local a = 6 + 5 * (i - 1)
  local id, task_id, attempt, mode = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  if idem_key == task_key then idem_key = nil end
  local h = redis.call('HMGET', task_key, 'status', 'attempt', 'entry_id', 'expires_at_ms',
    'content_type', 'metadata', 'created_at_ms', 'queue', 'task_type', 'started_at_ms',
    'worker_id', 'ckey')
  local status = h[1]
  if not status then
    drop(stream, id)
    redis.call('SREM', KEYS[1], task_id)  -- a cancelled task whose record expired
    publish('TASK_DUPLICATE_ABSORBED', now, task_id, '', '', attempt, consumer,
      {reason = 'no_record'})
    out[i] = {'absorbed'}
  elseif status == 'cancelled' then
    -- cancelled while queued: cancel.lua already recorded it and sent TASK_CANCELLED;
    -- its entry is only acked away here (no second event)
    drop(stream, id)
    redis.call('SREM', KEYS[1], task_id)
    out[i] = {'cancelled'}
  elseif status == 'active' and tonumber(h[2]) == attempt and h[3] == id then
    -- this very entry is active already: the call ran twice (a client re-sent it after
    -- losing the reply). The entry stays in the PEL, where the lease's fencing and the
    -- reaper find it; its consumer gets the same lease again (the first reply never
    -- reached it), any other consumer nothing.
    if h[11] == consumer then
      out[i] = {'ok', h[5], h[6], h[7], tonumber(h[10]) or now}
    else
      out[i] = {'absorbed'}
    end
  elseif status ~= 'queued' or tonumber(h[2]) ~= attempt or h[3] ~= id then
    drop(stream, id)
    publish('TASK_DUPLICATE_ABSORBED', now, task_id, h[8], h[9], attempt, consumer,
      {reason = 'stale_entry', status = status})
    out[i] = {'absorbed'}
  elseif (tonumber(h[4]) or 0) > 0 and now >= tonumber(h[4])
      and (tonumber(h[10]) or 0) == 0 then
    -- expiry means "not started by": a task that ever started (a retry, a released
    -- lease) follows its retry policy instead
    drop(stream, id)
    redis.call('HSET', task_key, 'status', 'expired', 'finished_at_ms', now, 'entry_id', '')
    idem_update(idem_key, task_id, 'failed', now)
    retire(task_key, now, retention)
    redis.call('ZREM', expiring_key, task_id)
    publish('TASK_EXPIRED', now, task_id, h[8], h[9], attempt, consumer, nil)
    ckey_refill(h[8], h[12])
    out[i] = {'expired'}
  elseif mode == 'r' then
    drop(stream, id)
    add_entry(stream, task_key, attempt, ARGV[a + 4])
    redis.call('HSET', task_key, 'updated_at_ms', now)
    out[i] = {'requeued'}
  elseif h[12] and h[12] ~= '' and not ckey_take(h[8], h[12]) then
    drop(stream, id)
    ckey_park(h[8], h[12], task_key, task_id, ARGV[a + 4], now)
    out[i] = {'parked'}
  else
    -- one HSET (hot path); the running attempt is status/worker_id/started_at_ms until
    -- its outcome is recorded as att:<n>
    redis.call('HSET', task_key, 'status', 'active', 'worker_id', consumer,
      'started_at_ms', now, 'updated_at_ms', now)
    if (tonumber(h[4]) or 0) > 0 then redis.call('ZREM', expiring_key, task_id) end
    publish('TASK_STARTED', now, task_id, h[8], h[9], attempt, consumer, nil)
    out[i] = {'ok', h[5], h[6], h[7], now}
  end
end
return out
