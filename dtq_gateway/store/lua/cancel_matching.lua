-- cancel_matching.lua: one bounded step of a bulk cancel (CancelTasks, PurgeQueue): read
-- at most `batch` waiting entries of ONE queue (one band stream, or its schedule) from a
-- cursor, and cancel (or with dry_run only count) the tasks that match the filter,
-- with the semantics of cancel.lua for each: a queued entry no read has taken is
-- deleted, one a lease read already took goes to the cancelled set (activate.lua acks
-- it away); a scheduled task leaves the schedule. A task a worker started (status
-- active) matches only when ARGV[16] asks for it, and is then flagged cancel_requested
-- as cancel.lua flags it (its worker stops it at its next heartbeat). Every key is of the queue's slot: the task records and
-- idempotency records are named from the ids the script reads (finished_task_keys,
-- idem_key_of), which carry the queue's slot tag.
--
-- KEYS[1] the band stream, the queue's schedule zset, or one concurrency key's parked
--         list dtq:conc:{<queue>}:parked:<key> (ARGV[4] says which; a parked task is
--         queued, out of its band: docs/fairness.md)
-- KEYS[2] the queue's cancelled set  [3] the queue's expiring zset
-- KEYS[4] the queue's finished index (DTQ_KEEP_FINISHED)  [5] the queue's counters hash
-- ARGV[3] queue  [4] 'stream' | 'schedule' | 'parked'
-- ARGV[5] cursor: stream = the last entry id read ('' = from the start);
--         schedule, parked = members to skip (those kept by earlier steps)
-- ARGV[6] batch (entries read, 1..1000)  [7] dry_run '1'/'0'
-- ARGV[8] task_type ('' = any)  [9] metadata JSON object of required pairs ('{}' = any)
-- ARGV[10] created at or after (epoch ms, 0 = none)  [11] created before (0 = none)
-- ARGV[12] task retention s  [13] DTQ_KEEP_FINISHED  [14] consumer group
-- ARGV[15] actor (TASK_CANCELLED metadata)
-- ARGV[16] the band entries' states that match: 'queued', 'active' or 'queued,active'
-- Reply: {next cursor, read, matched, cancelled, requested, ids...}: read < batch = the
-- end (requested: active tasks flagged).

local target, queue, kind = KEYS[1], ARGV[3], ARGV[4]
local cancelled_key, expiring_key, finished_key, counters_key = KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local batch, dry = tonumber(ARGV[6]), ARGV[7] == '1'
local want_type = ARGV[8]
local want_meta = cjson.decode(ARGV[9])
local after_ms, before_ms = tonumber(ARGV[10]), tonumber(ARGV[11])
local retention_s, keep, group = tonumber(ARGV[12]), tonumber(ARGV[13]), ARGV[14]
local want_queued = string.find(ARGV[16] or 'queued', 'queued', 1, true) ~= nil
local want_active = string.find(ARGV[16] or '', 'active', 1, true) ~= nil
local now = now_ms()

local function idem_key_of(digest)
  return 'dtq:idempotency:{' .. queue .. '}:' .. digest
end

local function matches(h)
  if want_type ~= '' and h[2] ~= want_type then return false end
  local created = tonumber(h[3]) or 0
  if after_ms > 0 and created < after_ms then return false end
  if before_ms > 0 and created >= before_ms then return false end
  if next(want_meta) ~= nil then
    local ok, meta = pcall(cjson.decode, h[4] or '')
    if not ok or type(meta) ~= 'table' then return false end
    for k, v in pairs(want_meta) do
      if meta[k] ~= v then return false end
    end
  end
  return true
end

local matched, done, requested, ids = 0, 0, 0, {}
local finished = {}

-- cancel one waiting task (h: HMGET below); `entry` = its band entry id or nil
local function cancel_one(task_key, task_id, h, entry)
  if entry then
    local p = redis.pcall('XPENDING', target, group, entry, entry, 1)
    local taken = type(p) ~= 'table' or p.err ~= nil or #p > 0
    if taken then redis.call('SADD', cancelled_key, task_id)
    else redis.call('XDEL', target, entry) end
    redis.call('HSET', task_key, 'entry_id', '')
  elseif kind == 'parked' then
    ckey_unpark_gone(queue, h[10], h[11], task_key, task_id)
  else
    redis.call('ZREM', target, task_id)
  end
  redis.call('ZREM', expiring_key, task_id)
  redis.call('HSET', task_key, 'status', 'cancelled', 'finished_at_ms', now)
  if h[6] and h[6] ~= '' and h[7] and h[7] ~= '' then
    idem_update(idem_key_of(h[7]), task_id, 'failed', now)
  end
  publish('TASK_CANCELLED', now, task_id, queue, h[2], h[5], '',
    {stage = h[1], bulk = true, actor = ARGV[15]})
  if entry then ckey_refill(queue, h[10]) end  -- _concurrency.lua
  retire(task_key, now, retention_s)
  finished[#finished + 1] = task_id
  done = done + 1
end

local function visit(task_id, entry)
  local task_key = finished_task_keys(task_id)
  local h = redis.call('HMGET', task_key, 'status', 'task_type', 'created_at_ms', 'metadata',
    'attempt', 'idem_key', 'idem_digest', 'entry_id', 'queue', 'ckey', 'parked',
    'worker_id', 'priority', 'cancel_requested')
  if h[9] ~= queue then return false end
  if entry then
    if h[8] ~= entry then return false end
    if not ((h[1] == 'queued' and want_queued) or (h[1] == 'active' and want_active)) then
      return false
    end
  elseif kind == 'parked' then
    if not (h[1] == 'queued' and h[11] == '1' and want_queued) then return false end
  elseif h[1] ~= 'scheduled' then
    return false
  end
  if not matches(h) then return false end
  matched = matched + 1
  ids[#ids + 1] = task_id
  if dry then return true end
  if h[1] == 'active' then
    if h[14] ~= '1' then  -- the notice goes out once per attempt, not per repeated call
      redis.call('HSET', task_key, 'cancel_requested', '1')
      publish_cancel_requested(now, task_id, queue, h[2], h[5], h[12], h[8], h[13], h[7])
    end
    keep_live(task_key, now)
    requested = requested + 1
    return false  -- its entry stays in the stream
  end
  cancel_one(task_key, task_id, h, entry)
  return true
end

local cursor, read = ARGV[5], 0
if kind == 'stream' then
  local start = cursor == '' and '-' or '(' .. cursor
  local entries = redis.call('XRANGE', target, start, '+', 'COUNT', batch)
  read = #entries
  for i = 1, #entries do
    local entry_id, f = entries[i][1], entries[i][2]
    local task_id
    for j = 1, #f, 2 do
      if f[j] == 'task_id' then task_id = f[j + 1]; break end
    end
    if task_id then visit(task_id, entry_id) end
    cursor = entry_id
  end
else
  local skip = tonumber(cursor) or 0
  local members
  if kind == 'parked' then
    members = redis.call('LRANGE', target, skip, skip + batch - 1)
  else
    members = redis.call('ZRANGE', target, '-inf', '+inf', 'BYSCORE', 'LIMIT', skip, batch)
  end
  read = #members
  local removed = 0
  for i = 1, #members do
    if visit(members[i], nil) and not dry then removed = removed + 1 end
  end
  cursor = tostring(skip + read - removed)
end
if done > 0 then
  redis.call('HINCRBY', counters_key, 'cancelled', done)
  keep_finished(finished_key, keep, finished)
end
local reply = {cursor, read, matched, done, requested}
for i = 1, #ids do reply[#reply + 1] = ids[i] end
return reply
