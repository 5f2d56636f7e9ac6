-- lease_take: lease read and activation in ONE call. Reads new entries for one consumer
-- (read_entries, _lease_read.lua: strict p9 -> p0, credit from the PEL, pause flags,
-- queue-wide rate limits) and activates each one (activate_entry, _activate.lua: the
-- same fencing checks and events as activate.lua), so a lease costs one round trip.
-- On Redis Cluster every queue of one call is in one hash slot (sessions are read slot
-- by slot, store/leasing.py session_layout).
-- Derived keys (SPEC section 1, docs/redis-layout.md): per entry read, the task record
-- <prefix>task:{<slot tag>}:<task id> (the tag after the id's '-' names the slot of the
-- queue the entry was read from; an untagged id of the older layout, standalone Redis
-- only, gives <prefix>task:<task id>) and the idempotency record
-- <prefix>idempotency:{<queue>}:<entry's idem_digest>. Both live in the slot of the
-- declared keys.
-- Per-key concurrency (_concurrency.lua) derives the queue's dtq:conc:{<queue>}:* keys
-- (same slot) for entries whose task has a concurrency key.
-- Not activated here (item 4 of the entry is {'read'}; the caller takes task-type tokens
-- and runs activate.lua, the two-step path): entries of queues with task-type rate
-- limits (task types the session takes), and entries with an idempotency key but no
-- idem_digest field (written before that field existed; their digest is a SHA-256 this
-- script cannot compute).
-- An entry whose task type the session does not take, or whose required labels it
-- lacks, is put back at the tail of its band (mode 'r': still queued, no attempt spent,
-- keeps its queued_at; its payload is left out of the reply).
-- Scan on: while a pass put entries back and credit is left (the credit of every entry
-- not leased is free again), the call reads again (read_pass,
-- again from p9 down, so strict priority holds), until it has read SCAN_MAX entries in
-- all (256; ARGV[13+t+m] overrides it). So one call gets past up to SCAN_MAX entries
-- the session does not take, whatever its credit; a stream whose last entry (as it was
-- before this call's first put-back into it) was read holds only this call's put-back
-- copies and is not read again in the call. The bound keeps the script short: each
-- entry read costs about ten commands.
-- KEYS[1..m]            pause flags dtq:queue:{<q>}:paused
-- KEYS[m+1 .. 2m]       rate limits dtq:queue:{<q>}:ratelimit
-- KEYS[2m+1 .. 3m]      cancelled sets dtq:cancelled:{<q>}
-- KEYS[3m+1 .. 4m]      expiry indexes dtq:expiring:{<q>}
-- KEYS[4m+1 .. 4m+n]    band streams, band-major (p9 of every queue, then p8, ...; n = 10m,
--                       or m for a read of one band)
-- KEYS[4m+n+1]          only with ARGV[14+t+m]: the worker's record
--                       dtq:worker:{workers}:<consumer> (standalone or Sentinel Redis
--                       only: on a cluster it is in another slot, worker_check.lua)
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
--         (0 = read nothing: count pending and report the non-empty streams, as a 6th
--         reply item {stream index, ...})  [7] m  [8] task retention s (records of tasks that
--         expire here)  [9] key prefix ('dtq:')  [10] t = number of task types the
--         session takes (0 = every type)  [11 .. 10+t] those types
--         [11+t .. 10+t+m] the queue names, in KEYS order
--         [11+t+m] the session's labels as a JSON object ('' = none): an entry whose
--         req_labels (required labels) it does not all contain is put back (mode 'r')
--         [12+t+m] turn: 0-based queue each band is read from first (read_entries;
--         docs/fairness.md)  [13+t+m] optional: the scan bound (entries read in all,
--         >= 1; '' or absent: SCAN_MAX)  [14+t+m] optional: check the worker first,
--         as worker_check.lua does (worker_state, _worker_state.lua), with this stale
--         threshold (ms, 0 = draining only); its record is the last KEY. A worker
--         the check stops (stalled or draining) gets nothing: the call only counts
--         pending and the non-empty streams, as a peek does, reads and activates
--         nothing, and reports the state. One call instead of worker_check +
--         lease_take (one EVALSHA and one TIME less per read).
-- Reply: {pending_before, {stream indexes without group}, cut (1: the scan bound
--         ended the call with credit left, more may be readable; else 0),
--         number of non-empty band streams (0 = every queue of the call is empty),
--         {wait_ms, {typed}, {limited}, {throttled}},
--         worker state (0 = ok or not checked, 1 = stalled, 2 = draining),
--         {stream index, entry id, {field, value, ...}, outcome}, ...}
--         (stream index is 1-based into the streams part; typed, limited and throttled
--         are 1-based queue indexes: queues with task-type limits, queues with any
--         limit, and queues whose queue-wide limit held entries back; wait_ms = ms until
--         the first throttled queue has a token again, 0 = none throttled; outcome is
--         activate.lua's reply for the entry, or {'read'}: not activated)
-- A queue-wide rate limit caps the COUNT of each XREADGROUP at the bucket's whole
-- tokens and takes one per entry read: a throttled task is never read, so it stays in
-- its stream, queued, in order, with no attempt spent (docs/rate-limits.md).
-- A queue-wide token taken for an entry that is not leased (absorbed, cancelled,
-- expired, put back) is returned to the bucket in this call.
local group, consumer = ARGV[3], ARGV[4]
local m, retention, prefix = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local t = tonumber(ARGV[10])
local wanted = nil
if t > 0 then
  wanted = {}
  for k = 1, t do wanted[ARGV[10 + k]] = true end
end
local function queue_name(q) return ARGV[10 + t + q] end
local labels = {}
if (ARGV[11 + t + m] or '') ~= '' then labels = cjson.decode(ARGV[11 + t + m]) end

-- true when the session has every label the entry requires (req_labels JSON object)
local function labels_ok(req)
  if not req or req == '' then return true end
  local ok, need = pcall(cjson.decode, req)
  if not ok or type(need) ~= 'table' then return true end  -- not dtq's: no requirement
  for k, v in pairs(need) do
    if labels[k] ~= v then return false end
  end
  return true
end

-- Most entries one call reads in all its passes (ARGV[13+t+m] overrides it): bounds
-- the script's run time (each entry read costs about ten commands: the read, the
-- fencing read and its activation or put-back) while letting one call get past up to
-- this many entries the session does not take.
local SCAN_MAX = 256

-- Activate reply[k0 ..] (entries just read); returns how many were not leased and
-- freed their credit (put back, parked, absorbed, cancelled, expired) and how many of
-- those were put back. Before the first
-- put-back into a stream, its last entry (tail[i]) is noted: the put-back copies go
-- after it, so once a pass has read it (st.last), the stream holds only copies of
-- entries this call put back and is not read again in this call.
local tail = {}
local function activate_from(reply, k0, allow, typed, now)
  local freed, back = 0, 0
  for k = k0, #reply do
    local entry = reply[k]
    local i, id, raw = entry[1], entry[2], entry[3]
    local q = ((i - 1) % m) + 1
    local f = {}
    for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
    local task_id = f['task_id']
    local idem, digest = f['idempotency_key'] or '', f['idem_digest'] or ''
    local mode = 'a'
    if (wanted and not wanted[f['task_type'] or '']) or not labels_ok(f['req_labels']) then
      mode = 'r'
      if not tail[i] then
        local last = redis.call('XREVRANGE', KEYS[4 * m + i], '+', '-', 'COUNT', 1)
        tail[i] = last[1] and last[1][1] or id
      end
    end
    if (mode == 'a' and typed[q]) or (idem ~= '' and digest == '') then
      entry[4] = {'read'}
    else
      local tag = string.match(task_id, '%-(.+)$')
      local task_key = prefix .. 'task:' .. task_id
      if tag then task_key = prefix .. 'task:{' .. tag .. '}:' .. task_id end
      local idem_key = nil
      if idem ~= '' then
        idem_key = prefix .. 'idempotency:{' .. queue_name(q) .. '}:' .. digest
      end
      local queued_at = f['queued_at'] or string.match(id, '^(%d+)')
      entry[4] = activate_entry({cancelled = KEYS[2 * m + q], expiring = KEYS[3 * m + q],
        stream = KEYS[4 * m + i], task_key = task_key, idem_key = idem_key, id = id,
        task_id = task_id, attempt = tonumber(f['attempt']), mode = mode,
        queued_at = queued_at}, consumer, retention, group, now)
      if entry[4][1] ~= 'ok' then
        freed = freed + 1
        if allow[q] then allow[q][1] = allow[q][1] + 1 end
      end
      if entry[4][1] == 'requeued' then
        back = back + 1
        -- the session does not take it: its payload is of no use to the caller
        for j = 1, #raw, 2 do if raw[j] == 'payload' then raw[j + 1] = '' end end
      end
    end
  end
  return freed, back
end

local n_streams, state, now, most = #KEYS - 4 * m, 0, 0, tonumber(ARGV[6])
local check_after = tonumber(ARGV[14 + t + m] or '')
if check_after then
  n_streams = n_streams - 1
  state, now = worker_state(KEYS[#KEYS], check_after)
  if state ~= 0 then most = 0 end  -- the worker may take nothing: a peek
end
local reply, allow, throttled, typed, st
reply, allow, throttled, typed, now, st = read_entries(group, consumer,
  tonumber(ARGV[5]), most, m, 4 * m, tonumber(ARGV[12 + t + m]) or 0,
  math.max(1, tonumber(ARGV[13 + t + m]) or SCAN_MAX), n_streams, now)
if state ~= 0 then
  reply[6], reply[7] = state, nil  -- no live list: the caller asked for a read
  return reply
end
if st and #reply > 6 then
  if now == 0 then now = now_ms() end
  local k0 = 7
  -- scan on while a pass put entries back, within the scan bound (SCAN_MAX)
  while k0 <= #reply do
    local freed, back = activate_from(reply, k0, allow, typed, now)
    st.credit = st.credit + freed
    if back == 0 or st.credit <= 0 or st.scanned >= st.scan_max then break end
    for i, last in pairs(st.last) do
      if tail[i] == last then st.skip[i] = true end
    end
    k0 = #reply + 1
    read_pass(st, reply)
  end
  -- the scan bound cut the call short: more may be readable for this session
  if st.credit > 0 and st.scanned >= st.scan_max then reply[3] = 1 end
end
store_limits(reply, allow, throttled, now, m)
return reply
