-- _activate.lua: one entry's activation, shared by activate.lua and lease_take.lua
-- (prepended by scripts.py). Per activated entry: one HMGET (the fencing read) and one
-- HSET; no TTL (a live record has none, see retire() in _lib.lua).

local function drop_entry(stream, group, id)
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
end

-- Turn one entry just read into an active lease of `consumer`, or absorb it.
-- e: {cancelled = the queue's cancelled set, expiring = its expiry index, stream,
--     task_key, idem_key (nil without an idempotency key), id (entry id), task_id,
--     attempt (number), mode ('a' activate | 'r' put back at the tail, still queued),
--     queued_at (epoch ms the task began to wait; used by mode 'r')}
-- Returns {'ok', content_type, metadata JSON, created_at_ms, leased_at_ms}
--   | {'absorbed'} | {'cancelled'} | {'expired'} | {'requeued'}
local function activate_entry(e, consumer, retention, group, now)
  local stream, task_key, idem_key, id = e.stream, e.task_key, e.idem_key, e.id
  local task_id, attempt = e.task_id, e.attempt
  local h = redis.call('HMGET', task_key, 'status', 'attempt', 'entry_id', 'expires_at_ms',
    'content_type', 'metadata', 'created_at_ms', 'queue', 'task_type', 'started_at_ms',
    'worker_id')
  local status = h[1]
  if not status then
    drop_entry(stream, group, id)
    redis.call('SREM', e.cancelled, task_id)  -- a cancelled task whose record expired
    publish('TASK_DUPLICATE_ABSORBED', now, task_id, '', '', attempt, consumer,
      {reason = 'no_record'})
    return {'absorbed'}
  elseif status == 'cancelled' then
    -- cancelled while queued: cancel.lua already recorded it and sent TASK_CANCELLED;
    -- its entry is only acked away here (no second event)
    drop_entry(stream, group, id)
    redis.call('SREM', e.cancelled, task_id)
    return {'cancelled'}
  elseif status == 'active' and tonumber(h[2]) == attempt and h[3] == id then
    -- this very entry is active already: the call ran twice (a client re-sent it after
    -- losing the reply). The entry stays in the PEL, where the lease's fencing and the
    -- reaper find it; its consumer gets the same lease again (the first reply never
    -- reached it), any other consumer nothing.
    if h[11] == consumer then
      return {'ok', h[5], h[6], h[7], tonumber(h[10]) or now}
    end
    return {'absorbed'}
  elseif status ~= 'queued' or tonumber(h[2]) ~= attempt or h[3] ~= id then
    drop_entry(stream, group, id)
    publish('TASK_DUPLICATE_ABSORBED', now, task_id, h[8], h[9], attempt, consumer,
      {reason = 'stale_entry', status = status})
    return {'absorbed'}
  elseif (tonumber(h[4]) or 0) > 0 and now >= tonumber(h[4])
      and (tonumber(h[10]) or 0) == 0 then
    -- expiry means "not started by": a task that ever started (a retry, a released
    -- lease) follows its retry policy instead
    drop_entry(stream, group, id)
    redis.call('HSET', task_key, 'status', 'expired', 'finished_at_ms', now, 'entry_id', '')
    idem_update(idem_key, task_id, 'failed', now)
    retire(task_key, now, retention)
    redis.call('ZREM', e.expiring, task_id)
    publish('TASK_EXPIRED', now, task_id, h[8], h[9], attempt, consumer, nil)
    return {'expired'}
  elseif e.mode == 'r' then
    drop_entry(stream, group, id)
    add_entry(stream, task_key, attempt, e.queued_at)
    redis.call('HSET', task_key, 'updated_at_ms', now)
    return {'requeued'}
  end
  -- one HSET (hot path); the running attempt is status/worker_id/started_at_ms until
  -- its outcome is recorded as att:<n>
  redis.call('HSET', task_key, 'status', 'active', 'worker_id', consumer,
    'started_at_ms', now, 'updated_at_ms', now)
  if (tonumber(h[4]) or 0) > 0 then redis.call('ZREM', e.expiring, task_id) end
  publish('TASK_STARTED', now, task_id, h[8], h[9], attempt, consumer, nil)
  return {'ok', h[5], h[6], h[7], now}
end
