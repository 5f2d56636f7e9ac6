-- lease_read: read new entries for one consumer, strictly p9 -> p0 across queues,
-- never exceeding the consumer's max_in_flight counted from the PEL.
-- KEYS[1..m]           pause flags dtq:queue:<q>:paused, one per queue
-- KEYS[m+1 .. m+10m]   band streams, band-major: p9 of every queue, then p8, ...
-- KEYS[#KEYS]          the worker's record dtq:worker:<id>
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
-- ARGV[7] m (number of queues)  [8] stale after ms: a worker whose last heartbeat is
--         older than this gets nothing (0 = no check)
-- Reply: {pending_before, {stream indexes without group}, worker state (0 = ok,
--         1 = stalled: no recent heartbeat, 2 = draining: end its sessions),
--         number of non-empty band streams (0 = every queue of the call is empty, whatever
--         the worker state), {stream index, entry id, {field, value, ...}}, ...}
--         (stream index is 1-based into the streams part)
-- A stalled worker (SIGSTOPped, GC-paused, partitioned with its stream still open) would
-- otherwise receive new leases as the reaper takes its old ones away, and burn an
-- attempt of each: it only gets work again once it heartbeats.
local group, consumer = ARGV[3], ARGV[4]
local max_in_flight, max_count, m = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local stale_after = tonumber(ARGV[8])
local n_streams = #KEYS - m - 1
local missing = {}
local pending = 0
-- XLEN counts queued and pending entries alike (entries are deleted when their lease
-- ends), so an empty stream needs no further call; at rest most bands are empty.
local live = {}
for i = 1, n_streams do
  if redis.call('XLEN', KEYS[m + i]) > 0 then
    live[#live + 1] = i
    -- summary form: O(consumers holding entries), not O(entries held)
    local r = redis.pcall('XPENDING', KEYS[m + i], group)
    if type(r) == 'table' and r.err then
      missing[#missing + 1] = i
    elseif r[4] then
      for _, c in ipairs(r[4]) do
        if c[1] == consumer then pending = pending + tonumber(c[2]) end
      end
    end
  end
end
local reply = {pending, missing, 0, #live}
local w = redis.call('HMGET', KEYS[#KEYS], 'last_heartbeat', 'status')
if w[2] == 'draining' then
  reply[3] = 2
  return reply
end
if stale_after > 0 and now_ms() - (tonumber(w[1] or '0') or 0) > stale_after then
  reply[3] = 1
  return reply
end
local credit = math.min(max_in_flight - pending, max_count)
if credit <= 0 then return reply end

local paused = {}
for q = 1, m do paused[q] = redis.call('EXISTS', KEYS[q]) == 1 end
local skip = {}
for _, i in ipairs(missing) do skip[i] = true end

for _, i in ipairs(live) do
  local q = ((i - 1) % m) + 1
  if not paused[q] and not skip[i] then
    local r = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', credit,
      'STREAMS', KEYS[m + i], '>')
    if type(r) == 'table' and r.err then
      reply[2][#reply[2] + 1] = i
    elseif r then
      for _, e in ipairs(r[1][2]) do
        reply[#reply + 1] = {i, e[1], e[2]}
        credit = credit - 1
      end
      if credit <= 0 then break end
    end
  end
end
return reply
