-- ack: complete leases successfully (fenced), n leases per call (one Ack's items, in
-- chunks), so the per-call costs (EVALSHA framing, the constant arguments, the one
-- events message) are paid once. Per lease: HMGET (fencing), HSET, EXPIRE (the
-- retention clock starts now), SET of the result only when it is not empty, and GET/SET
-- of the idempotency record when the task has one; per band stream of the call one
-- XACK and one XDEL with every completed entry id (a call per id cost twice the CPU).
-- Per lease i, from k = (i-1)*6:
--   KEYS[k+1] band stream  [k+2] task hash  [k+3] result string  [k+4] idempotency record,
--   or the task hash again when the task has no idempotency key
--   [k+5] chain-pending zset of the task's queue dtq:chains:pending:{<queue>}: a task with a
--   chain step still to create is added (member task id, score now) in this same call,
--   so "A succeeded" and "B is owed" are one atomic fact; followups.py creates B and
--   removes A, and the leader's follow-up sweep finishes what a dead gateway left.
--   [k+6] the queue's counters hash dtq:queue:{<q>}:counters (field succeeded: one HINCRBY
--   per queue per call)
-- KEYS[n*6+1] (optional) the queue's finished index dtq:finished:{<q>} (every lease of
--   one call is of one queue); present when ARGV[7] > 0
-- ARGV[3] group  [4] n leases  [5] result TTL s  [6] task retention s
-- ARGV[7] DTQ_KEEP_FINISHED ('0' or absent = no count limit; see _finished.lua)
-- then per lease i, 7 values from a = 7 + (i-1)*7:
--   [a+1] entry id  [a+2] attempt  [a+3] worker id  [a+4] task id  [a+5] result bytes
--   [a+6] '1' if the result was truncated  [a+7] lease tag (see current_lease)
-- Reply: one item per lease, in order:
--   {'ok', started_at_ms, created_at_ms, finished_at_ms, follow, unparked} | {'dup', status}
--   | {'stale', status}; follow: 'c' chain step owed, 'g' group member, 'cg' both, '' none;
--   unparked: tasks of the lease's concurrency key moved back to their band (0 or 1)
local group, n = ARGV[3], tonumber(ARGV[4])
local result_ttl_s, retention_s = tonumber(ARGV[5]), tonumber(ARGV[6])
local keep = tonumber(ARGV[7]) or 0
local now = now_ms()
local finished = {}  -- task ids completed by this call (for the finished index)
local done = {}  -- band stream key -> entry ids completed by this call
local succeeded = {}  -- counters hash key -> leases completed by this call

local function ack_one(k, a)
  local stream, task_key, result_key = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local idem_key = KEYS[k + 4] ~= task_key and KEYS[k + 4] or nil
  local chain_key = KEYS[k + 5]
  local id, attempt, worker, task_id = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local h, status = current_lease(task_key, id, worker, attempt, ARGV[a + 7],
    {'started_at_ms', 'created_at_ms', 'task_type', 'follow', 'ckey'})
  if not h then
    if finished_by(task_key, id, 'ack', attempt, worker) then return {'dup', status} end
    return {'stale', status or 'missing'}
  end
  local ids = done[stream]
  if not ids then ids = {}; done[stream] = ids end
  ids[#ids + 1] = id
  finished[#finished + 1] = task_id
  succeeded[KEYS[k + 6]] = (succeeded[KEYS[k + 6]] or 0) + 1
  -- one HSET for the state, the attempt record and the stamp (hot path). The attempt
  -- JSON is concatenated: worker ids are [A-Za-z0-9_.:@-] and the numbers are Redis
  -- TIME values, so nothing needs escaping (cjson per task cost more).
  -- Fields that do not exist yet are appended after a scan of the whole listpack, so
  -- ack adds three (finished_at_ms, done, att:<n>) and result_truncated only when set.
  redis.call('HSET', task_key, 'status', 'succeeded', 'finished_at_ms', now, 'entry_id', '',
    'done', 'ack:' .. id,
    'att:' .. attempt, '{"worker_id":"' .. worker .. '","started_at_ms":' .. h[8]
      .. ',"finished_at_ms":' .. now .. ',"outcome":"succeeded","error_message":"",'
      .. '"error_class":""}',
    'updated_at_ms', now)
  if ARGV[a + 6] == '1' then redis.call('HSET', task_key, 'result_truncated', '1') end
  redis.call('EXPIRE', task_key, retention_s)
  -- an empty result stores nothing: GetTask answers an empty result either way
  if ARGV[a + 5] ~= '' then redis.call('SET', result_key, ARGV[a + 5], 'EX', result_ttl_s) end
  idem_update(idem_key, task_id, 'completed', now)
  local unparked = ckey_release(h[5], h[12])  -- its concurrency key's slot (_concurrency.lua)
  publish('TASK_SUCCEEDED', now, task_id, h[5], h[10], attempt, worker, nil)
  -- follow: 'c' (a chain step follows), 'g' (group member), 'cg'; absent on most tasks,
  -- so one field read covers both (a missing field costs a scan of the record)
  local follow = h[11] or ''
  if string.find(follow, 'c', 1, true) then redis.call('ZADD', chain_key, now, task_id) end
  return {'ok', h[8], h[9], now, follow, unparked}
end

local replies = {}
for i = 1, n do replies[i] = ack_one((i - 1) * 6, 7 + (i - 1) * 7) end
-- the same script call, so the record and the PEL/stream change together
for stream, ids in pairs(done) do
  redis.call('XACK', stream, group, unpack(ids))
  redis.call('XDEL', stream, unpack(ids))
end
for counters_key, count in pairs(succeeded) do
  redis.call('HINCRBY', counters_key, 'succeeded', count)
end
if keep > 0 then keep_finished(KEYS[n * 6 + 1], keep, finished) end
return replies
