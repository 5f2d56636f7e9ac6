-- requeue_dead_letter.lua: a dead-lettered task back into its band with a fresh
-- attempt budget (attempt 1), in one step. Every key is of the task's queue (one hash
-- slot); the caller appends the audit entry and, when this call set the busy marker,
-- adds the queue to dtq:queues:busy (both span queues).
-- KEYS[1]  task hash (dtq:task:{<tag>}:<id>)
-- KEYS[2]  the queue's dead-letter stream (dtq:stream:{<q>}:dead-letter)
-- KEYS[3]  band stream of the task's queue and priority (dtq:stream:{<q>}:p<band>)
-- KEYS[4]  the queue's busy marker (dtq:queue:{<q>}:busy)
-- KEYS[5]  unused (the task hash again)
-- KEYS[6]  optional: idempotency record (dtq:idempotency:{<q>}:<digest>)
-- ARGV[1..2] events channel, event id prefix (_lib.lua convention)
-- ARGV[3..7] unused (audit MAXLEN, actor, request id, action, detail: the caller audits)
-- ARGV[8]  expected queue   ARGV[9] expected priority (the caller built KEYS[3] from them)
-- ARGV[10] task retention (s)   ARGV[11] consumer group name
-- ARGV[12] idempotency TTL (s): the window of a key record this requeue takes over
-- Reply: {"OK", ts (epoch ms), new entry id, became_busy (1 = this call set the marker)}
--     or {"NOT_FOUND"} (no hash), {"NO_ENTRY"} (no dead-letter entry: discarded,
--     purged or trimmed), {"WRONG_STATE", status}, {"MISMATCH"} (KEYS[3] is not the
--     task's band), {"KEY_TAKEN", other task id} (the task's idempotency key now belongs
--     to another live task: requeueing would make two live tasks for one key).
-- Effects: XDEL of the dead-letter entry; the earlier attempt records move to the
-- JSON array field prev_attempts; status queued, attempt 1, requeues + 1,
-- expires_at_ms / due_at_ms cleared (an operator asked for this run); a new band
-- entry (add_entry) and the queue in the busy set; idempotency record back to
-- processing if it still names this task; TASK_QUEUED {requeued=true}.
local task_key = KEYS[1]
if redis.call('EXISTS', task_key) == 0 then return {'NOT_FOUND'} end
local f = redis.call('HMGET', task_key, 'status', 'dlq_entry_id', 'queue', 'priority',
  'task_id', 'task_type', 'discarded', 'prev_attempts')
if f[1] ~= 'dead_lettered' then return {'WRONG_STATE', f[1] or ''} end
if (not f[2]) or f[2] == '' or f[7] == '1' then return {'NO_ENTRY'} end
if #redis.call('XRANGE', KEYS[2], f[2], f[2]) == 0 then return {'NO_ENTRY'} end
if f[3] ~= ARGV[8] or f[4] ~= ARGV[9] then return {'MISMATCH'} end
if KEYS[6] then
  -- at most one live task per idempotency key: a key that a later Enqueue took over
  -- while this task was dead-lettered stays with that task while it is live
  local raw = redis.call('GET', KEYS[6])
  local rec = raw and cjson.decode(raw)
  if rec and rec.task_id ~= f[5] and rec.state == 'processing' then
    return {'KEY_TAKEN', rec.task_id}
  end
end
local ms = now_ms()

-- Archive att:<n> (ordered by n) so the new attempt 1 does not overwrite history.
local prev = {}
if f[8] and f[8] ~= '' then prev = cjson.decode(f[8]) end
local numbered = {}
for _, k in ipairs(redis.call('HKEYS', task_key)) do
  local n = string.match(k, '^att:(%d+)$')
  if n then table.insert(numbered, tonumber(n)) end
end
table.sort(numbered)
for _, n in ipairs(numbered) do
  local rec = cjson.decode(redis.call('HGET', task_key, 'att:' .. n))
  rec.attempt = n
  table.insert(prev, rec)
  redis.call('HDEL', task_key, 'att:' .. n)
end
if #prev > 0 then redis.call('HSET', task_key, 'prev_attempts', cjson.encode(prev)) end

redis.call('XDEL', KEYS[2], f[2])
redis.call('HSET', task_key, 'status', 'queued', 'dlq_entry_id', '', 'finished_at_ms', 0,
  'started_at_ms', 0, 'cancel_requested', '0', 'due_at_ms', 0, 'expires_at_ms', 0)
redis.call('HINCRBY', task_key, 'requeues', 1)
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], ARGV[11], '0', 'MKSTREAM')
local entry_id = add_entry(KEYS[3], task_key, 1)
local became_busy = redis.call('SET', KEYS[4], '1', 'NX') and 1 or 0
if KEYS[6] then
  -- the requeued task is live with its key: the key names it again (a record of an
  -- ended task, or none left, is taken over; a live holder was refused above)
  redis.call('SET', KEYS[6], cjson.encode({task_id = f[5], state = 'processing',
    updated_at = ms, expires_at_ms = ms + tonumber(ARGV[12] or '86400') * 1000}))
end
keep_live(task_key, ms)
publish('TASK_QUEUED', ms, f[5], f[3], f[6], 1, '', {requeued = 'true'})
return {'OK', ms, entry_id, became_busy}
