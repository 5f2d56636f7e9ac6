-- concurrency_set: set, change or delete a queue's per-key concurrency limit
-- (_concurrency.lua), and give parked tasks the slots that became free: per key with
-- parked tasks, up to (limit - active) of them (all of them when the limit is deleted)
-- go back to the tail of their band streams, at most `budget` per call (the caller
-- calls again while the reply says more may be moved).
-- KEYS[1] dtq:conc:{<q>}:limit  [2] dtq:conc:{<q>}:active  [3] dtq:conc:{<q>}:waiting
-- ARGV[3] queue  [4] the limit, 1..1000000 ('0' = delete it; '' = keep it as it is and
-- only move what its free slots allow)  [5] budget: most tasks moved by this call
-- Reply: {previous limit (0 = none), tasks moved, 1 = more may be moved else 0}
local limit_key, active_key, waiting_key = KEYS[1], KEYS[2], KEYS[3]
local queue, budget = ARGV[3], tonumber(ARGV[5])
local previous = tonumber(redis.call('GET', limit_key)) or 0
local limit = previous
if ARGV[4] ~= '' then
  limit = tonumber(ARGV[4])
  if limit > 0 then redis.call('SET', limit_key, limit) else redis.call('DEL', limit_key) end
end
local moved = 0
local waiting = redis.call('HGETALL', waiting_key)
for i = 1, #waiting, 2 do
  local ckey = waiting[i]
  local free = budget - moved
  if limit > 0 then
    local active = tonumber(redis.call('HGET', active_key, ckey)) or 0
    free = math.min(free, limit - active)
  end
  if free > 0 then moved = moved + ckey_unpark(queue, ckey, free) end
  if moved >= budget then return {previous, moved, 1} end
end
return {previous, moved, 0}
