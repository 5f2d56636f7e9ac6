-- _lib.lua: helpers prepended to every dtq script by dtq_gateway/scripts.py.
-- Convention for every script: ARGV[1] = events channel name, ARGV[2] = event id
-- prefix (24 hex chars, fresh per call); script arguments start at ARGV[3].
-- Time comes from Redis TIME (one clock for every gateway replica).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ISO 8601 UTC with milliseconds from epoch ms (civil-from-days, no os.date in Redis).
local function iso(ms)
  local s = math.floor(ms / 1000)
  local days = math.floor(s / 86400)
  local rem = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d,
    math.floor(rem / 3600), math.floor((rem % 3600) / 60), rem % 60, ms % 1000)
end

local EVENTS_CHANNEL = ARGV[1]
local EVENT_PREFIX = ARGV[2]
local event_seq = 0

-- Publish one lifecycle event with the seed's JSON shape.
local function publish(ev_type, ms, task_id, queue, task_type, attempt, worker_id, metadata)
  event_seq = event_seq + 1
  local ev = {
    event_id = EVENT_PREFIX .. string.format('%08x', event_seq),
    ts = iso(ms), type = ev_type, task_id = task_id or '', queue = queue or '',
    task_type = task_type or '', attempt = tonumber(attempt) or 0, worker_id = worker_id or '',
  }
  if metadata then ev.metadata = metadata end
  redis.call('PUBLISH', EVENTS_CHANNEL, cjson.encode(ev))
end

-- The JSON value of the task hash field att:<n> (one attempt's outcome).
local function attempt_json(worker_id, started_ms, finished_ms, outcome, err, err_class)
  return cjson.encode({
    worker_id = worker_id or '', started_at_ms = tonumber(started_ms) or 0,
    finished_at_ms = tonumber(finished_ms) or 0, outcome = outcome,
    error_message = err or '', error_class = err_class or '' })
end

-- Record the outcome of attempt n in the task hash field att:<n> (JSON).
local function record_attempt(task_key, n, worker_id, started_ms, finished_ms, outcome, err, err_class)
  redis.call('HSET', task_key, 'att:' .. n,
    attempt_json(worker_id, started_ms, finished_ms, outcome, err, err_class))
end

-- Refresh the retention TTL of a task hash (DTQ_TASK_RETENTION_S) and stamp it.
local function touch(task_key, ms, retention_s)
  redis.call('HSET', task_key, 'updated_at_ms', ms)
  redis.call('EXPIRE', task_key, retention_s)
end

-- XADD a dispatch entry (the seed's entry fields) for the task into stream_key,
-- executing attempt `attempt`. Records the entry id on the hash; returns it.
local function add_entry(stream_key, task_key, attempt)
  local f = redis.call('HMGET', task_key, 'task_id', 'queue', 'task_type', 'payload',
    'max_attempts', 'priority', 'timeout_ms', 'idem_key')
  local id = redis.call('XADD', stream_key, '*', 'task_id', f[1], 'queue', f[2],
    'task_type', f[3], 'payload', f[4] or '', 'attempt', attempt, 'max_attempts', f[5],
    'priority', f[6], 'timeout_ms', f[7], 'idempotency_key', f[8] or '')
  redis.call('HSET', task_key, 'entry_id', id, 'attempt', attempt)
  return id
end

-- Move a task to the dead-letter stream (MAXLEN ~ maxlen) with the seed's extra
-- fields; the hash becomes dead_lettered. Returns the dead-letter entry id.
local function dead_letter(dlq_key, maxlen, task_key, attempt, ms, err, err_class, worker_id)
  local f = redis.call('HMGET', task_key, 'task_id', 'queue', 'task_type', 'payload',
    'max_attempts', 'priority', 'timeout_ms', 'idem_key')
  local id = redis.call('XADD', dlq_key, 'MAXLEN', '~', maxlen, '*',
    'task_id', f[1], 'queue', f[2], 'task_type', f[3], 'payload', f[4] or '',
    'attempt', attempt, 'max_attempts', f[5], 'priority', f[6], 'timeout_ms', f[7],
    'idempotency_key', f[8] or '', 'failed_at_ms', ms, 'attempts_made', attempt,
    'last_error', err or '', 'last_error_class', err_class or '', 'retryable', '0',
    'worker_id', worker_id or '', 'original_queue', f[2])
  redis.call('HSET', task_key, 'status', 'dead_lettered', 'finished_at_ms', ms,
    'last_error', err or '', 'last_error_class', err_class or '', 'dlq_entry_id', id,
    'entry_id', '')
  return id
end

-- Update the idempotency record (if this task still owns it) to state, keeping its TTL.
local function idem_update(idem_key, task_id, state, ms)
  if not idem_key then return end
  local raw = redis.call('GET', idem_key)
  if not raw then return end
  local rec = cjson.decode(raw)
  if rec.task_id ~= task_id then return end
  redis.call('SET', idem_key, cjson.encode({task_id = task_id, state = state, updated_at = ms}),
    'KEEPTTL')
end

-- True when entry `id` of `stream` is in the group's PEL and owned by `consumer`.
local function owns(stream, group, id, consumer)
  local r = redis.pcall('XPENDING', stream, group, id, id, 1)
  if type(r) ~= 'table' or r.err or not r[1] then return false end
  return r[1][2] == consumer
end

-- True when this Ack/Fail repeats the one that finished the task: `id` is the entry the
-- task last finished with `kind` ('ack' | 'fail'), and the recorded outcome of attempt
-- `attempt` belongs to `worker`. A lease id with another attempt or worker is stale.
local function finished_by(task_key, id, kind, attempt, worker)
  local d = redis.call('HMGET', task_key, 'done_entry_id', 'done_kind', 'att:' .. attempt)
  if d[1] ~= id or d[2] ~= kind or not d[3] then return false end
  local ok, rec = pcall(cjson.decode, d[3])
  return ok and type(rec) == 'table' and rec.worker_id == worker
end

-- Fencing check shared by ack/fail/heartbeat. Returns the HMGET of `fields` when the
-- lease (stream entry id, consumer, attempt) is the task's current one, else nil
-- plus the task status (false when the hash is gone).
local function current_lease(stream, group, task_key, id, consumer, attempt, fields)
  local h = redis.call('HMGET', task_key, 'status', 'attempt', 'entry_id', unpack(fields))
  if h[1] ~= 'active' or tonumber(h[2]) ~= tonumber(attempt) or h[3] ~= id then
    return nil, h[1]
  end
  if not owns(stream, group, id, consumer) then return nil, h[1] end
  return h, h[1]
end
