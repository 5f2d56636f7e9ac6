-- prune_consumers.lua: delete the consumers of ONE queue's band streams that hold no
-- pending entry and have not read for a while (workers that are gone). A worker id
-- becomes a consumer of each band stream it reads; without this, every worker id ever
-- used stays in XINFO CONSUMERS for good.
--
-- A consumer with pending entries is never deleted (XGROUP DELCONSUMER would drop its
-- PEL and the leases with it): the reaper claims those entries first once they expire,
-- and a later call deletes the then empty consumer. The check and the delete happen in
-- this one script, so no read can give the consumer an entry in between. A live worker
-- whose consumer was deleted gets it back with its next read.
--
-- KEYS[1..10] dtq:stream:{<queue>}:p9 .. p0
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")
-- ARGV[4] idle (ms): delete only consumers that have not read for at least this long
-- ARGV[5] the reaper's own consumer name (kept)
-- Reply: number of consumers deleted
local group, min_idle, reaper = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local deleted = 0
for i = 1, 10 do
  local r = redis.pcall('XINFO', 'CONSUMERS', KEYS[i], group)
  if type(r) == 'table' and not r.err then
    for _, c in ipairs(r) do
      local info = {}
      for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
      if info.name ~= reaper and tonumber(info.pending) == 0
          and tonumber(info.idle) >= min_idle then
        redis.call('XGROUP', 'DELCONSUMER', KEYS[i], group, info.name)
        deleted = deleted + 1
      end
    end
  end
end
return deleted
