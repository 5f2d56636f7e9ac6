-- queue_summaries.lua: headline numbers of a page of queues (ListQueues), in one call.
-- Per band stream one XLEN, and the XPENDING summary only for a non-empty stream
-- (entries are deleted when their lease ends, so an empty stream has nothing pending);
-- at rest most bands are empty, so a page costs about 11 commands per queue and a
-- reply of three numbers per queue.
--
-- KEYS, per queue i (stride 11, from k = (i-1)*11):
--   KEYS[k+1 .. k+10] dtq:stream:{<queue>}:p9 .. p0
--   KEYS[k+11]        dtq:queue:{<queue>}:paused
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")
--
-- Reply: {{depth, pending, paused (0/1)}, ...}, one item per queue, in KEYS order.
-- depth = entries in the ten streams (queued + leased); pending = entries leased and
-- not finished (a stream without the group counts none).

local group = ARGV[3]
local reply = {}
for k = 0, #KEYS - 11, 11 do
  local depth, pending = 0, 0
  for i = k + 1, k + 10 do
    local n = redis.call('XLEN', KEYS[i])
    if n > 0 then
      depth = depth + n
      local r = redis.pcall('XPENDING', KEYS[i], group)
      if type(r) == 'table' and not r.err then pending = pending + r[1] end
    end
  end
  reply[#reply + 1] = {depth, pending, redis.call('EXISTS', KEYS[k + 11])}
end
return reply
