-- _lib.lua: helpers prepended to every dtq script by dtq_gateway/store/scripts.py.
-- Convention for every script: ARGV[1] = events channel name, ARGV[2] = event id
-- prefix (24 hex chars, fresh per call); script arguments start at ARGV[3].
-- Time comes from Redis TIME (one clock for every gateway replica).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local EVENTS_CHANNEL = ARGV[1]
local EVENT_PREFIX = ARGV[2]
local events = {}
local events_ms = 0

-- Queue one lifecycle event (ms: Redis TIME of the change, epoch ms; metadata: a table
-- or nil). scripts.py appends a call of flush_events() to every script, which publishes
-- all events of the call as ONE message:
--   {"ts_ms": ms, "id_prefix": EVENT_PREFIX, "events": [[type, task_id, queue,
--    task_type, attempt, worker_id, metadata|null], ...]}
-- The gateway's events hub expands it into one event per entry (event_id = id_prefix ..
-- '%08x' of the 1-based position, ts = ISO 8601 of ts_ms). One PUBLISH and one JSON
-- encode per call instead of one per task (docs/performance.md, round 3).
local function publish(ev_type, ms, task_id, queue, task_type, attempt, worker_id, metadata)
  events_ms = ms
  events[#events + 1] = {ev_type, task_id or '', queue or '', task_type or '',
    tonumber(attempt) or 0, worker_id or '', metadata or cjson.null}
end

-- The internal event TASK_CANCEL_REQUESTED (no EventType: Events.Subscribe never shows
-- it): CancelTask flagged an active task. It carries what, with the owner tag of a
-- Lease session of worker_id, makes the lease id (leasing/leaseid.py), so every replica
-- can push the cancel on that worker's streams (docs/protocol.md 8).
local function publish_cancel_requested(ms, task_id, queue, task_type, attempt, worker_id,
                                        entry_id, band, idem_digest)
  publish('TASK_CANCEL_REQUESTED', ms, task_id, queue, task_type, attempt, worker_id,
    {entry_id = entry_id or '', band = band or '', idem_digest = idem_digest or ''})
end

local function flush_events()
  if #events == 0 then return end
  redis.call('PUBLISH', EVENTS_CHANNEL, cjson.encode({ts_ms = events_ms,
    id_prefix = EVENT_PREFIX, events = events}))
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

-- Task record TTLs: a live record (scheduled, queued, active) has NO TTL, so no task
-- can vanish while it waits or runs however long that takes; the retention clock
-- (DTQ_TASK_RETENTION_S) starts when the task reaches a terminal state (succeeded,
-- dead_lettered, cancelled, expired). One EXPIRE per task lifecycle instead of one per
-- transition.

-- Stamp a terminal record and start its retention TTL.
local function retire(task_key, ms, retention_s)
  redis.call('HSET', task_key, 'updated_at_ms', ms)
  redis.call('EXPIRE', task_key, retention_s)
end

-- Stamp a record that stays (or becomes) live again; PERSIST drops a TTL that an
-- older dtq version set on live records (rare paths only: retries, releases, moves).
local function keep_live(task_key, ms)
  redis.call('HSET', task_key, 'updated_at_ms', ms)
  redis.call('PERSIST', task_key)
end

-- The consumer group of every band stream (keys.GROUP; tests/unit/test_keys.py checks
-- that they agree).
local CONSUMER_GROUP = 'workers'

-- Band summary of a queue, dtq:queue:{<queue>}:bands (docs/redis-layout.md): a set of
-- the band digits whose streams may hold entries, plus the member '*' once a lease read
-- probed all ten bands and rebuilt it (only then is it trusted; it lives BANDS_TTL_MS,
-- so every queue is probed in full at least that often). The set's key for a band
-- stream key <prefix>stream:{<queue>}:p<n>, or nil for another key.
local BANDS_TTL_MS = 1000
local function bands_key(stream_key)
  local prefix, tag = string.match(stream_key, '^(.-)stream:(%b{}):p%d$')
  if not prefix then return nil end
  return prefix .. 'queue:' .. tag .. ':bands'
end

-- Add the band of `stream_key` to its queue's summary (one SADD); a set this creates
-- gets the TTL too, so it never outlives its queue.
local function note_band(stream_key)
  local key = bands_key(stream_key)
  if key and redis.call('SADD', key, string.sub(stream_key, -1)) == 1
      and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, BANDS_TTL_MS)
  end
end

-- XADD `fields` (a flat name, value list) to the band stream `stream_key`; returns the
-- entry id. NOMKSTREAM: a band stream that does not exist (its queue was deleted, maybe
-- by another replica whose deletion this gateway's group cache has not seen) is created
-- with its consumer group first, so no entry lands in a stream no group reads. No extra
-- command when the stream exists.
local function xadd_band(stream_key, fields)
  local id = redis.call('XADD', stream_key, 'NOMKSTREAM', '*', unpack(fields))
  if not id then
    redis.call('XGROUP', 'CREATE', stream_key, CONSUMER_GROUP, '0', 'MKSTREAM')
    id = redis.call('XADD', stream_key, '*', unpack(fields))
  end
  note_band(stream_key)
  return id
end

-- XADD a dispatch entry (the seed's entry fields) for the task into stream_key,
-- executing attempt `attempt`. Records the entry id on the hash; returns it.
local function add_entry(stream_key, task_key, attempt, queued_at)
  local f = redis.call('HMGET', task_key, 'task_id', 'queue', 'task_type', 'payload',
    'max_attempts', 'priority', 'timeout_ms', 'idem_key', 'idem_digest', 'req_labels')
  local fields = {'task_id', f[1], 'queue', f[2], 'task_type', f[3], 'payload', f[4] or '',
    'attempt', attempt, 'max_attempts', f[5], 'priority', f[6], 'timeout_ms', f[7],
    'idempotency_key', f[8] or ''}
  if f[8] and f[8] ~= '' and f[9] then
    -- the record's digest (see enqueue.lua): internal keys are hashed apart
    fields[#fields + 1] = 'idem_digest'
    fields[#fields + 1] = f[9]
  end
  if f[10] and f[10] ~= '' then
    -- required labels (docs/fairness.md): the dispatcher routes on the entry alone
    fields[#fields + 1] = 'req_labels'
    fields[#fields + 1] = f[10]
  end
  if queued_at then
    -- an entry put back unleased keeps the time its task began to wait (epoch ms), so
    -- the backlog age of a task no session takes keeps growing
    fields[#fields + 1] = 'queued_at'
    fields[#fields + 1] = queued_at
  end
  local id = xadd_band(stream_key, fields)
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

-- Update the idempotency record (if this task still owns it) to state. The record has no
-- TTL while its task is live (state 'processing'), so a key dedupes for as long as the
-- task may still run, whatever its delay, backoff or DTQ_IDEM_TTL_S; a terminal state
-- ('completed', 'failed') sets the expiry enqueue.lua recorded in it (expires_at_ms =
-- enqueue + DTQ_IDEM_TTL_S, already past = gone at once). A record written before
-- expires_at_ms existed keeps the TTL it has.
local function idem_update(idem_key, task_id, state, ms)
  if not idem_key then return end
  local raw = redis.call('GET', idem_key)
  if not raw then return end
  local rec = cjson.decode(raw)
  if rec.task_id ~= task_id then return end
  local value = cjson.encode({task_id = task_id, state = state, updated_at = ms,
    expires_at_ms = rec.expires_at_ms})
  if state == 'processing' then
    redis.call('SET', idem_key, value)
  elseif rec.expires_at_ms then
    redis.call('SET', idem_key, value, 'PXAT', rec.expires_at_ms)
  else
    redis.call('SET', idem_key, value, 'KEEPTTL')
  end
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
  local d = redis.call('HMGET', task_key, 'done', 'att:' .. attempt)
  if d[1] ~= kind .. ':' .. id or not d[2] then return false end
  local ok, rec = pcall(cjson.decode, d[2])
  return ok and type(rec) == 'table' and rec.worker_id == worker
end

-- Fencing check shared by ack/fail/heartbeat. Returns the HMGET of status, attempt,
-- entry_id, worker_id, queue, priority, idem_digest and then `fields` (so fields[i] is
-- h[7 + i]) when the lease (stream entry id, consumer, attempt) is the task's current
-- one, else nil plus the task status (false when the hash is gone). `tag` is the lease's
-- '<queue>:<band>:<idem digest or ->' (leaseid.Lease.tag): the caller built the stream
-- and idempotency KEYS from those fields, so they must be the record's own (entry ids
-- repeat across streams). Every transition that ends a lease changes the record's
-- status, entry_id or attempt in the same script, and activation records the consumer
-- in worker_id, so the record alone decides; the PEL owner is not read (an entry the
-- reaper claimed but had not yet reclaimed can still be completed by its worker:
-- reclaim.lua then finds it gone and does nothing).
local function current_lease(task_key, id, consumer, attempt, tag, fields)
  local h = redis.call('HMGET', task_key, 'status', 'attempt', 'entry_id', 'worker_id',
    'queue', 'priority', 'idem_digest', unpack(fields))
  if h[1] ~= 'active' or tonumber(h[2]) ~= tonumber(attempt) or h[3] ~= id
      or h[4] ~= consumer then
    return nil, h[1]
  end
  local digest = h[7]
  if not digest or digest == '' then digest = '-' end
  if tag ~= h[5] .. ':' .. h[6] .. ':' .. digest then return nil, h[1] end
  return h, h[1]
end
