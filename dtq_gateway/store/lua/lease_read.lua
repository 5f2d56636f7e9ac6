-- lease_read: read new entries for one consumer, strictly p9 -> p0 across the queues of
-- the call, never exceeding the consumer's max_in_flight counted from the PEL. On Redis
-- Cluster every queue of one call is in one hash slot (a session's queues are read slot
-- by slot); on a standalone Redis one call reads all of a session's queues (see
-- store/leasing.py, session_layout). The worker's own state is checked by worker_check.lua.
-- KEYS[1..m]           pause flags dtq:queue:{<q>}:paused, one per queue
-- KEYS[m+1 .. 2m]      rate limits dtq:queue:{<q>}:ratelimit, one per queue (_bucket.lua)
-- KEYS[2m+1 .. 2m+n]   band streams, band-major: p9 of every queue, then p8, ... (n = 10m,
--                      or m for a read of one band)
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
--         (0 = read nothing: count pending and report the non-empty streams, as a 6th
--         reply item {stream index, ...})
-- ARGV[7] m (number of queues)  [8] turn: 0-based queue each band is read from first, the
--         others after it in call order, wrapping around (the caller advances it per
--         call, so queues of one band are served in turn: docs/fairness.md)
-- Reply: {pending_before, {stream indexes without group}, 0,
--         number of non-empty band streams (0 = every queue of the call is empty),
--         {wait_ms, {typed}, {limited}, {throttled}},
--         {stream index, entry id, {field, value, ...}}, ...}
--         (stream index is 1-based into the streams part; typed, limited and throttled
--         are 1-based queue indexes: queues with task-type limits, queues with any
--         limit, and queues whose queue-wide limit held entries back; wait_ms = ms until
--         the first throttled queue has a token again, 0 = none throttled)
-- A queue-wide rate limit caps the COUNT of each XREADGROUP at the bucket's whole
-- tokens and takes one per entry read: a throttled task is never read, so it stays in
-- its stream, queued, in order, with no attempt spent (docs/rate-limits.md).
local group, consumer = ARGV[3], ARGV[4]
local max_in_flight, max_count, m = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n_streams = #KEYS - 2 * m
local S = 2 * m  -- streams start after the pause flags and the rate-limit keys
local missing = {}
local pending = 0
-- XLEN counts queued and pending entries alike (entries are deleted when their lease
-- ends), so an empty stream needs no further call; at rest most bands are empty.
local live = {}
for i = 1, n_streams do
  if redis.call('XLEN', KEYS[S + i]) > 0 then
    live[#live + 1] = i
    -- summary form: O(consumers holding entries), not O(entries held)
    local r = redis.pcall('XPENDING', KEYS[S + i], group)
    if type(r) == 'table' and r.err then
      missing[#missing + 1] = i
    elseif r[4] then
      for _, c in ipairs(r[4]) do
        if c[1] == consumer then pending = pending + tonumber(c[2]) end
      end
    end
  end
end
local limits = {0, {}, {}, {}}
local reply = {pending, missing, 0, #live, limits}
if max_count == 0 then
  reply[6] = live
  return reply
end
local credit = math.min(max_in_flight - pending, max_count)
if credit <= 0 then return reply end

local paused = {}
for q = 1, m do paused[q] = redis.call('EXISTS', KEYS[q]) == 1 end
local skip = {}
for _, i in ipairs(missing) do skip[i] = true end
-- round robin within a band: queue turn+1 first (bands stay strictly p9 -> p0)
local turn = (tonumber(ARGV[8]) or 0) % m
if turn > 0 then
  table.sort(live, function(x, y)
    local bx, by = math.floor((x - 1) / m), math.floor((y - 1) / m)
    if bx ~= by then return bx < by end
    return (x - 1 - turn) % m < (y - 1 - turn) % m
  end)
end

-- rate limits of the queues that have live streams (one EXISTS per such queue)
local now = 0
local allow = {}  -- q -> {tokens, limit, period_ms} of its queue-wide bucket
local live_q = {}
for _, i in ipairs(live) do live_q[((i - 1) % m) + 1] = true end
for q = 1, m do
  if live_q[q] and not paused[q] and redis.call('EXISTS', KEYS[m + q]) == 1 then
    if now == 0 then now = now_ms() end
    limits[3][#limits[3] + 1] = q
    local tok, limit, period = bucket_level(KEYS[m + q], '*', now)
    if tok then allow[q] = {tok, limit, period} end
    if redis.call('HEXISTS', KEYS[m + q], 'types') == 1 then limits[2][#limits[2] + 1] = q end
  end
end

local throttled = {}
for _, i in ipairs(live) do
  local q = ((i - 1) % m) + 1
  if not paused[q] and not skip[i] then
    local count, a = credit, allow[q]
    if a then count = math.min(count, math.floor(a[1])) end
    if count <= 0 then
      throttled[q] = true
    else
      local r = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
        'STREAMS', KEYS[S + i], '>')
      if type(r) == 'table' and r.err then
        reply[2][#reply[2] + 1] = i
      elseif r then
        for _, e in ipairs(r[1][2]) do
          reply[#reply + 1] = {i, e[1], e[2]}
          credit = credit - 1
        end
        if a then
          a[1] = a[1] - #r[1][2]
          -- tokens ran out while this stream had more: held back until a refill
          if count < credit + #r[1][2] and #r[1][2] == count then throttled[q] = true end
        end
      end
      if credit <= 0 then break end
    end
  end
end
for q, a in pairs(allow) do
  bucket_store(KEYS[m + q], '*', a[1], now)
  if throttled[q] then
    limits[4][#limits[4] + 1] = q
    local w = bucket_wait_ms(a[1] - math.floor(a[1]), a[2], a[3])
    if limits[1] == 0 or w < limits[1] then limits[1] = w end
  end
end
return reply
