-- enqueue: create tasks, each queued in its band stream or scheduled for later.
-- One call enqueues n tasks of ONE queue (EnqueueBatch sends chunks per queue; Enqueue
-- sends n = 1), so every key is in the queue's hash slot and the per-call costs
-- (EVALSHA framing, TIME, the busy marker, the one events message) are paid once per
-- chunk; per task it runs XADD (or ZADD to the schedule) and one HSET, plus GET/SET of
-- the idempotency record when the task has a key. The record gets no TTL here: a live
-- task never expires (see retire() in _lib.lua). The recent-tasks index and the busy
-- set span queues: the caller writes them after this call (single-key commands), except
-- on a standalone Redis, where the caller names the recent-tasks index as the last KEY
-- and this call writes it (ZADD, and trim to ARGV[6] when the caller asks for it: the
-- gateway trims every few dozen tasks, not on every call): one round trip per Enqueue,
-- not two.
-- KEYS[1]  the queue's schedule zset  dtq:retry:{<queue>}:schedule
-- KEYS[2]  the queue's busy marker    dtq:queue:{<queue>}:busy
-- KEYS[3]  the queue's expiry index  dtq:expiring:{<queue>} (queued tasks with an expiry)
-- then per task i (stride s = 3, +1 when the call debounces, +10 with a depth limit),
-- from k = 3 + (i-1)*s:
--   KEYS[k+1] task hash dtq:task:{<slot>}:<id>   KEYS[k+2] band stream dtq:stream:{<queue>}:p<priority>
--   KEYS[k+3] idempotency record dtq:idempotency:{<queue>}:<sha256>, or the debounce
--             record dtq:debounce:{<queue>}:<sha256> of a debounced task (the task hash
--             again when the task has neither)
--   KEYS[k+4] (debouncing calls only) the task hash the caller believes the debounce
--             record points at (the new task's own hash when it knows none)
--   then the queue's ten band streams (depth gate; only with a depth limit)
-- KEYS[3 + n*s + 1] (optional; standalone Redis only) the recent-tasks index dtq:tasks:recent
-- ARGV[3] n tasks  [4] 1 = the call debounces (one more KEY and ARGV per task), else 0
-- [5] idempotency TTL s  [6] recent max entries: trim the recent-tasks index to this
-- many ('' = no trim in this call)  [7] max queue depth (0 = none)
-- then per task i, 21 values (22 when the call debounces) from a = 7 + (i-1)*21 (or 22):
--   [a+1] task_id  [a+2] queue  [a+3] task_type  [a+4] payload  [a+5] content_type
--   [a+6] priority 0..9  [a+7] max_attempts  [a+8] timeout_ms  [a+9] idempotency key
--   ('' = none)  [a+10] idempotency digest  [a+11] metadata JSON  [a+12] backoff_base_ms
--   [a+13] backoff_cap_ms  [a+14] delay_ms  [a+15] not_before_ms (epoch)
--   [a+16] expires_at_ms (epoch)  [a+17] ttl_ms  [a+18] take-over task id ('' = none): an
--   idempotency record pointing at this (vanished) task may be replaced.
--   [a+19] extra record fields as a flat JSON array [name, value, ...] ('' = none):
--   chain and group membership (followups.py), written by the same HSET-bearing call so
--   a task never exists without its follow-ups.
--   [a+20] concurrency key ('' = none; docs/fairness.md): the record field ckey
--   [a+21] required labels as a JSON object ('' = none; docs/fairness.md): the record
--   field req_labels and the entry field of the same name
--   [a+22] (debouncing calls only) '' = no debounce, else
--   '<first|last>:<window ms>:<max delay ms>:<believed task id>' (see debounce() below)
-- Reply: one item per task, in order:
--   {'ok', task_id, status} | {'dup', earlier task_id, earlier state} | {'full', depth}
--   | {'debounced', earlier task_id, its status} (absorbed; keep_last replaced the
--   payload and pushed the due time) | {'debounce_retry', task id the record points
--   at} (the caller believed another: call again with that task's hash as KEYS[k+4])
-- then one last item {'meta', now_ms, became_busy (1 = this call set the busy marker:
-- the caller adds the queue to dtq:queues:busy), created task ids and times for the
-- recent-tasks index as {ms, id, ms, id, ...} (empty when this call wrote it), trimmed
-- (1 = this call trimmed the recent-tasks index, else 0)}
local schedule_key, busy_key, expiring_key = KEYS[1], KEYS[2], KEYS[3]
local n = tonumber(ARGV[3])
local idem_ttl_s = tonumber(ARGV[5])
local recent_max, max_depth = tonumber(ARGV[6]), tonumber(ARGV[7])
local deb_on = ARGV[4] == '1'
local dk = deb_on and 1 or 0
local stride = 3 + dk + (max_depth > 0 and 10 or 0)
local astride = 21 + dk
local now = now_ms()
local recent, depths = {}, {}
local busy = false

-- Depth of a queue's bands (queued + leased entries), read once per call and counted
-- up locally as this call adds entries.
local function depth_of(queue, k)
  local d = depths[queue]
  if not d then
    d = 0
    for i = k + 4 + dk, k + 13 + dk do d = d + redis.call('XLEN', KEYS[i]) end
  end
  return d
end

-- Debounce (one transition per outcome, all in this call): the record
-- {task_id, mode, first_ms, until_ms} in the queue's slot names the burst's task.
-- keep_first: within until_ms every enqueue is absorbed, whatever the task's state.
-- keep_last: while the task is still scheduled and never started, replace its payload,
-- content type and metadata and push its due time to now + window, capped at
-- first_ms + max delay (0 = no cap). Otherwise (no record, window over, task moved
-- on) nil: the caller creates a new task and a new record.
-- Returns a reply, or nil and the due time a new task gets (0 = its own timing).
local function debounce(k, a)
  local mode, window, max_delay, believed =
    string.match(ARGV[a + 22], '^(%a+):(%d+):(%d+):(.*)$')
  window, max_delay = tonumber(window), tonumber(max_delay)
  local new_due = mode == 'last' and now + window or 0
  local raw = redis.call('GET', KEYS[k + 3])
  if not raw then return nil, new_due end
  local rec = cjson.decode(raw)
  if rec.mode ~= mode then return nil, new_due end
  if rec.task_id ~= believed then return {'debounce_retry', rec.task_id} end
  local prev_key = KEYS[k + 4]
  if mode == 'first' then
    if now >= rec.until_ms then return nil, new_due end
    return {'debounced', rec.task_id, redis.call('HGET', prev_key, 'status') or 'unknown'}
  end
  local f = redis.call('HMGET', prev_key, 'status', 'started_at_ms', 'attempt')
  if f[1] ~= 'scheduled' or (tonumber(f[2]) or 0) ~= 0 or tonumber(f[3]) ~= 1 then
    return nil, new_due  -- left the schedule or started: never changed
  end
  local due = new_due
  if max_delay > 0 and due > rec.first_ms + max_delay then due = rec.first_ms + max_delay end
  redis.call('HSET', prev_key, 'due_at_ms', due, 'updated_at_ms', now,
    'content_type', ARGV[a + 5], 'metadata', ARGV[a + 11], 'payload', ARGV[a + 4])
  redis.call('ZADD', schedule_key, due, rec.task_id)
  rec.until_ms = due
  redis.call('SET', KEYS[k + 3], cjson.encode(rec), 'PX', due - now + math.max(window, 60000))
  return {'debounced', rec.task_id, 'scheduled'}
end

local function enqueue_one(k, a)
  local task_key, stream_key = KEYS[k + 1], KEYS[k + 2]
  local task_id, queue, task_type, payload = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local idem = ARGV[a + 9]
  local idem_key = idem ~= '' and KEYS[k + 3] or nil

  if idem_key then
    local raw = redis.call('GET', idem_key)
    if raw then
      local rec = cjson.decode(raw)
      if rec.state ~= 'failed' and rec.task_id ~= ARGV[a + 18] then
        return {'dup', rec.task_id, rec.state}
      end
    end
  end

  local deb_due = 0
  if deb_on and ARGV[a + 22] ~= '' then
    local reply
    reply, deb_due = debounce(k, a)
    if reply then return reply end
  end

  local due = 0
  local delay_ms, not_before = tonumber(ARGV[a + 14]), tonumber(ARGV[a + 15])
  if delay_ms > 0 then due = now + delay_ms elseif not_before > now then due = not_before end
  if deb_due > 0 then due = deb_due end
  local expires_at = tonumber(ARGV[a + 16])
  if tonumber(ARGV[a + 17]) > 0 then expires_at = now + tonumber(ARGV[a + 17]) end

  local status, due_at = 'queued', 0
  if due > now then status, due_at = 'scheduled', due end

  if max_depth > 0 then
    local depth = depth_of(queue, k)
    if depth >= max_depth then return {'full', depth} end
    if status == 'queued' then depths[queue] = depth + 1 else depths[queue] = depth end
  end

  local entry_id = ''
  if status == 'queued' then
    -- the seed's entry fields, from the arguments (no read-back of the hash just written)
    -- xadd_band (_lib.lua): a band stream that is gone comes back with its group
    local fields = {'task_id', task_id, 'queue', queue,
      'task_type', task_type, 'payload', payload, 'attempt', 1,
      'max_attempts', ARGV[a + 7], 'priority', ARGV[a + 6], 'timeout_ms', ARGV[a + 8],
      'idempotency_key', idem}
    if idem ~= '' then
      -- the record's digest: an internal key (schedule fire, chain step, group
      -- callback) is hashed apart from a client's, so it cannot be derived from the text
      fields[#fields + 1] = 'idem_digest'
      fields[#fields + 1] = ARGV[a + 10]
    end
    if ARGV[a + 21] ~= '' then
      fields[#fields + 1] = 'req_labels'
      fields[#fields + 1] = ARGV[a + 21]
    end
    entry_id = xadd_band(stream_key, fields)
    -- the scheduler leader expires it there if no worker starts it in time
    if expires_at > 0 then redis.call('ZADD', expiring_key, expires_at, task_id) end
  else
    redis.call('ZADD', schedule_key, due, task_id)
  end
  busy = true

  -- one HSET for the record (hot path). Field order matters: a small hash is a
  -- listpack, where HMGET/HSET find a field by scanning from the front, so the fields
  -- every later script reads or rewrites come first (worker_id and started_at_ms are
  -- created here for that reason) and the payload and the cold fields come last.
  redis.call('HSET', task_key, 'status', status, 'attempt', 1, 'entry_id', entry_id,
    'worker_id', '', 'started_at_ms', 0, 'ckey', ARGV[a + 20], 'updated_at_ms', now,
    'expires_at_ms', expires_at, 'created_at_ms', now, 'queue', queue, 'task_type', task_type,
    'content_type', ARGV[a + 5], 'metadata', ARGV[a + 11], 'task_id', task_id,
    'priority', ARGV[a + 6], 'max_attempts', ARGV[a + 7], 'timeout_ms', ARGV[a + 8],
    'idem_key', idem, 'idem_digest', ARGV[a + 10], 'backoff_base_ms', ARGV[a + 12],
    'backoff_cap_ms', ARGV[a + 13], 'not_before_ms', not_before, 'due_at_ms', due_at,
    'payload', payload)
  if ARGV[a + 19] ~= '' then
    redis.call('HSET', task_key, unpack(cjson.decode(ARGV[a + 19])))
  end
  if ARGV[a + 21] ~= '' then redis.call('HSET', task_key, 'req_labels', ARGV[a + 21]) end

  recent[#recent + 1] = now
  recent[#recent + 1] = task_id

  if idem_key then
    -- no TTL while the task is live; its terminal state sets expires_at_ms (idem_update)
    redis.call('SET', idem_key, cjson.encode({task_id = task_id, state = 'processing',
      updated_at = now, expires_at_ms = now + idem_ttl_s * 1000}))
  end

  if deb_on and ARGV[a + 22] ~= '' then
    -- the burst's record: keep_first holds it for the window; keep_last until the
    -- task is due, with slack for a late scheduler (the task's state decides anyway)
    local mode, window = string.match(ARGV[a + 22], '^(%a+):(%d+):')
    window = tonumber(window)
    local until_ms = mode == 'last' and due or now + window
    local ttl = mode == 'last' and (due - now + math.max(window, 60000)) or window
    redis.call('SET', KEYS[k + 3], cjson.encode({task_id = task_id, mode = mode,
      first_ms = now, until_ms = until_ms}), 'PX', ttl)
  end

  local meta = nil
  if status == 'scheduled' then meta = {due_at_ms = due} end
  publish('TASK_QUEUED', now, task_id, queue, task_type, 1, '', meta)
  return {'ok', task_id, status}
end

local replies = {}
for i = 1, n do
  replies[i] = enqueue_one(3 + (i - 1) * stride, 7 + (i - 1) * astride)
end
local became_busy = 0
if busy and redis.call('SET', busy_key, '1', 'NX') then became_busy = 1 end
local index_key, trimmed = KEYS[3 + n * stride + 1], 0
if index_key and #recent > 0 then
  redis.call('ZADD', index_key, unpack(recent))  -- {ms, id, ...}: score, member pairs
  if recent_max then
    redis.call('ZREMRANGEBYRANK', index_key, 0, -(recent_max + 1))
    trimmed = 1
  end
  recent = {}  -- written: nothing left for the caller
end
replies[n + 1] = {'meta', now, became_busy, recent, trimmed}
return replies
