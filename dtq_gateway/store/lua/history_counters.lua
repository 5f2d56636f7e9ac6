-- history_counters: the outcomes of one queue since its previous history sample.
-- Reads the cumulative counters that ack.lua and fail.lua add to, returns how much each
-- grew since the baseline this script stored last time, and stores the new baseline in
-- the same hash (fields h_succeeded, h_retried, h_dead_lettered), so no outcome is
-- counted twice or lost between two samples, whichever replica took the previous one.
-- KEYS[1] counters hash dtq:queue:{<queue>}:counters
-- Reply: {succeeded, retried, dead_lettered} since the previous sample (a counter below
-- its baseline, i.e. the queue was deleted and made again, counts from zero); {0, 0, 0}
-- without writing anything when the hash does not exist.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return {0, 0, 0} end
local v = redis.call('HMGET', key, 'succeeded', 'retried', 'dead_lettered',
                     'h_succeeded', 'h_retried', 'h_dead_lettered')
local out = {}
for i = 1, 3 do
  local now, base = tonumber(v[i]) or 0, tonumber(v[i + 3]) or 0
  out[i] = now >= base and now - base or now
end
redis.call('HSET', key, 'h_succeeded', tonumber(v[1]) or 0, 'h_retried', tonumber(v[2]) or 0,
           'h_dead_lettered', tonumber(v[3]) or 0)
return out
