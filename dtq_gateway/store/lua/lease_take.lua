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
-- Not activated here (item 4 of the entry is {'read'}; the caller takes task-type tokens
-- and runs activate.lua, the two-step path): entries of queues with task-type rate
-- limits (task types the session takes), and entries with an idempotency key but no
-- idem_digest field (written before that field existed; their digest is a SHA-256 this
-- script cannot compute).
-- An entry whose task type the session does not take is put back at the tail of its
-- band (mode 'r': still queued, no attempt spent, keeps its queued_at).
-- KEYS[1..m]            pause flags dtq:queue:{<q>}:paused
-- KEYS[m+1 .. 2m]       rate limits dtq:queue:{<q>}:ratelimit
-- KEYS[2m+1 .. 3m]      cancelled sets dtq:cancelled:{<q>}
-- KEYS[3m+1 .. 4m]      expiry indexes dtq:expiring:{<q>}
-- KEYS[4m+1 .. 4m+n]    band streams, band-major (p9 of every queue, then p8, ...; n = 10m,
--                       or m for a read of one band)
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
--         (0 = read nothing: count pending and report the non-empty streams, as a 6th
--         reply item {stream index, ...})  [7] m  [8] task retention s (records of tasks that
--         expire here)  [9] key prefix ('dtq:')  [10] t = number of task types the
--         session takes (0 = every type)  [11 .. 10+t] those types
--         [11+t .. 10+t+m] the queue names, in KEYS order
-- Reply: {pending_before, {stream indexes without group}, 0,
--         number of non-empty band streams (0 = every queue of the call is empty),
--         {wait_ms, {typed}, {limited}, {throttled}},
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

local reply, allow, throttled, typed, now = read_entries(group, consumer,
  tonumber(ARGV[5]), tonumber(ARGV[6]), m, 4 * m)
if tonumber(ARGV[6]) > 0 and #reply > 5 then
  if now == 0 then now = now_ms() end
  for k = 6, #reply do
    local entry = reply[k]
    local i, id, raw = entry[1], entry[2], entry[3]
    local q = ((i - 1) % m) + 1
    local f = {}
    for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
    local task_id = f['task_id']
    local idem, digest = f['idempotency_key'] or '', f['idem_digest'] or ''
    local mode = 'a'
    if wanted and not wanted[f['task_type'] or ''] then mode = 'r' end
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
      if entry[4][1] ~= 'ok' and allow[q] then allow[q][1] = allow[q][1] + 1 end
    end
  end
end
store_limits(reply, allow, throttled, now, m)
return reply
