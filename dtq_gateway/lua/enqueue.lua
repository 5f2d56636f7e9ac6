-- enqueue: create a task, queued in its band stream or scheduled for later.
-- KEYS[1]  task hash            dtq:task:<id>
-- KEYS[2]  band stream          dtq:stream:<queue>:p<priority>
-- KEYS[3]  retry schedule zset  dtq:retry:schedule
-- KEYS[4]  recent tasks zset    dtq:tasks:recent
-- KEYS[5..14] the queue's ten band streams (depth gate)
-- KEYS[15] idempotency record   dtq:idempotency:<queue>:<sha256>   (only with a key)
-- ARGV[3] task_id  [4] queue  [5] task_type  [6] payload  [7] content_type
-- ARGV[8] priority 0..9  [9] max_attempts  [10] timeout_ms  [11] idempotency key ('' = none)
-- ARGV[12] idempotency digest  [13] metadata JSON  [14] backoff_base_ms  [15] backoff_cap_ms
-- ARGV[16] delay_ms  [17] not_before_ms (epoch)  [18] expires_at_ms (epoch)  [19] ttl_ms
-- ARGV[20] task retention s  [21] idempotency TTL s  [22] recent max entries
-- ARGV[23] max queue depth (0 = none)  [24] take-over task id ('' = none): an idempotency
--          record pointing at this (vanished) task may be replaced.
-- Reply: {'ok', task_id, status} | {'dup', earlier task_id, earlier state} | {'full', depth}
local task_key, stream_key, schedule_key, recent_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local idem_key = KEYS[15]
local task_id = ARGV[3]
local now = now_ms()

if idem_key then
  local raw = redis.call('GET', idem_key)
  if raw then
    local rec = cjson.decode(raw)
    if rec.state ~= 'failed' and rec.task_id ~= ARGV[24] then
      return {'dup', rec.task_id, rec.state}
    end
  end
end

local max_depth = tonumber(ARGV[23])
if max_depth > 0 then
  local depth = 0
  for i = 5, 14 do depth = depth + redis.call('XLEN', KEYS[i]) end
  if depth >= max_depth then return {'full', depth} end
end

local due = 0
local delay_ms, not_before = tonumber(ARGV[16]), tonumber(ARGV[17])
if delay_ms > 0 then due = now + delay_ms elseif not_before > now then due = not_before end
local expires_at = tonumber(ARGV[18])
if tonumber(ARGV[19]) > 0 then expires_at = now + tonumber(ARGV[19]) end

local status, due_at = 'queued', 0
if due > now then status, due_at = 'scheduled', due end

-- one HSET for the record, its status and the touch stamp (hot path)
redis.call('HSET', task_key, 'task_id', task_id, 'queue', ARGV[4], 'task_type', ARGV[5],
  'payload', ARGV[6], 'content_type', ARGV[7], 'priority', ARGV[8], 'max_attempts', ARGV[9],
  'timeout_ms', ARGV[10], 'idem_key', ARGV[11], 'idem_digest', ARGV[12], 'metadata', ARGV[13],
  'backoff_base_ms', ARGV[14], 'backoff_cap_ms', ARGV[15], 'attempt', 1, 'entry_id', '',
  'created_at_ms', now, 'not_before_ms', not_before, 'expires_at_ms', expires_at,
  'status', status, 'due_at_ms', due_at, 'updated_at_ms', now)

if status == 'scheduled' then
  redis.call('ZADD', schedule_key, due, task_id)
else
  add_entry(stream_key, task_key, 1)
end
redis.call('EXPIRE', task_key, tonumber(ARGV[20]))

redis.call('ZADD', recent_key, now, task_id)
redis.call('ZREMRANGEBYRANK', recent_key, 0, -(tonumber(ARGV[22]) + 1))

if idem_key then
  redis.call('SET', idem_key, cjson.encode({task_id = task_id, state = 'processing',
    updated_at = now}), 'EX', tonumber(ARGV[21]))
end

local meta = nil
if status == 'scheduled' then meta = {due_at_ms = due} end
publish('TASK_QUEUED', now, task_id, ARGV[4], ARGV[5], 1, '', meta)
return {'ok', task_id, status}
