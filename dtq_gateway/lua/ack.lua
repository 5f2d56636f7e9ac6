-- ack: complete leases successfully (fenced), n leases per call (one Ack's items, in
-- chunks), so the per-call costs (EVALSHA framing, the constant arguments) are paid once.
-- Per lease i, from k = (i-1)*4:
--   KEYS[k+1] band stream  [k+2] task hash  [k+3] result string  [k+4] idempotency record
--   or the task hash again (see has_idem)
-- ARGV[3] group  [4] n leases  [5] result TTL s  [6] task retention s
-- then per lease i, 7 values from a = 6 + (i-1)*7:
--   [a+1] entry id  [a+2] attempt  [a+3] worker id  [a+4] task id  [a+5] result bytes
--   [a+6] '1' if the result was truncated  [a+7] has_idem '1'/'0'
-- Reply: one item per lease, in order:
--   {'ok', started_at_ms, created_at_ms, finished_at_ms} | {'dup', status} | {'stale', status}
local group, n = ARGV[3], tonumber(ARGV[4])
local result_ttl_s, retention_s = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()

local function ack_one(k, a)
  local stream, task_key, result_key = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local idem_key = ARGV[a + 7] == '1' and KEYS[k + 4] or nil
  local id, attempt, worker, task_id = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local h, status = current_lease(stream, group, task_key, id, worker, attempt,
    {'started_at_ms', 'created_at_ms', 'queue', 'task_type', 'done_entry_id', 'done_kind'})
  if not h then
    if finished_by(task_key, id, 'ack', attempt, worker) then return {'dup', status} end
    return {'stale', status or 'missing'}
  end
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  -- one HSET for the state, the attempt record and the touch stamp (hot path)
  redis.call('HSET', task_key, 'status', 'succeeded', 'finished_at_ms', now, 'entry_id', '',
    'done_entry_id', id, 'done_kind', 'ack', 'result_truncated', ARGV[a + 6],
    'att:' .. attempt, attempt_json(worker, h[4], now, 'succeeded', '', ''),
    'updated_at_ms', now)
  redis.call('EXPIRE', task_key, retention_s)
  redis.call('SET', result_key, ARGV[a + 5], 'EX', result_ttl_s)
  idem_update(idem_key, task_id, 'completed', now)
  publish('TASK_SUCCEEDED', now, task_id, h[6], h[7], attempt, worker, nil)
  return {'ok', h[4], h[5], now}
end

local replies = {}
for i = 1, n do replies[i] = ack_one((i - 1) * 4, 6 + (i - 1) * 7) end
return replies
