-- lease_read: read new entries for one consumer, strictly p9 -> p0 across the queues of
-- the call, never exceeding the consumer's max_in_flight counted from the PEL. Every
-- queue of one call is in one hash slot (a session's queues are read slot by slot, see
-- sessions.py); the worker's own state is checked by worker_check.lua.
-- KEYS[1..m]           pause flags dtq:queue:{<q>}:paused, one per queue
-- KEYS[m+1 .. m+10m]   band streams, band-major: p9 of every queue, then p8, ...
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
--         (0 = read nothing: count pending and report the non-empty streams, as a 5th
--         reply item {stream index, ...})
-- ARGV[7] m (number of queues)  [8] unused
-- Reply: {pending_before, {stream indexes without group}, 0,
--         number of non-empty band streams (0 = every queue of the call is empty),
--         {stream index, entry id, {field, value, ...}}, ...}
--         (stream index is 1-based into the streams part)
local group, consumer = ARGV[3], ARGV[4]
local max_in_flight, max_count, m = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n_streams = #KEYS - m
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
if max_count == 0 then
  reply[5] = live
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
