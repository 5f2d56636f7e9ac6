-- ack: complete a lease successfully (fenced).
-- KEYS[1] band stream  [2] task hash  [3] result string  [4] idempotency record or the
--         task hash again (see has_idem)
-- ARGV[3] group  [4] entry id  [5] attempt  [6] worker id  [7] task id  [8] result bytes
-- ARGV[9] '1' if the result was truncated  [10] result TTL s  [11] task retention s
-- ARGV[12] has_idem '1'/'0'
-- Reply: {'ok', started_at_ms, created_at_ms, finished_at_ms} | {'dup'} | {'stale', status}
local stream, task_key, result_key = KEYS[1], KEYS[2], KEYS[3]
local idem_key = ARGV[12] == '1' and KEYS[4] or nil
local group, id, attempt, worker, task_id = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local h, status = current_lease(stream, group, task_key, id, worker, attempt,
  {'started_at_ms', 'created_at_ms', 'queue', 'task_type', 'done_entry_id', 'done_kind'})
if not h then
  local d = redis.call('HMGET', task_key, 'done_entry_id', 'done_kind')
  if d[1] == id and d[2] == 'ack' then return {'dup'} end
  return {'stale', status or 'missing'}
end
local now = now_ms()
redis.call('XACK', stream, group, id)
redis.call('XDEL', stream, id)
-- one HSET for the state, the attempt record and the touch stamp (hot path)
redis.call('HSET', task_key, 'status', 'succeeded', 'finished_at_ms', now, 'entry_id', '',
  'done_entry_id', id, 'done_kind', 'ack', 'result_truncated', ARGV[9],
  'att:' .. attempt, attempt_json(worker, h[4], now, 'succeeded', '', ''),
  'updated_at_ms', now)
redis.call('EXPIRE', task_key, tonumber(ARGV[11]))
redis.call('SET', result_key, ARGV[8], 'EX', tonumber(ARGV[10]))
idem_update(idem_key, task_id, 'completed', now)
publish('TASK_SUCCEEDED', now, task_id, h[6], h[7], attempt, worker, nil)
return {'ok', h[4], h[5], now}
