-- _worker_state.lua: the worker check shared by worker_check.lua and lease_take.lua
-- (prepended by scripts.py).
-- worker_state(key, stale_after): may the worker whose record is KEYS-declared `key`
-- (dtq:worker:{workers}:<id>) get new leases? stale_after (ms): a worker whose last
-- heartbeat is older than this gets nothing (0 = no heartbeat check).
-- Returns the state (0 = ok, 1 = stalled: no recent heartbeat, 2 = draining: end its
-- sessions) and the Redis TIME read for the check in epoch ms (0 = none was read).
-- A stalled worker (SIGSTOPped, GC-paused, partitioned with its stream still open) would
-- otherwise receive new leases as the reaper takes its old ones away, and burn an
-- attempt of each: it only gets work again once it heartbeats.
local function worker_state(key, stale_after)
  local w = redis.call('HMGET', key, 'last_heartbeat', 'status')
  if w[2] == 'draining' then return 2, 0 end
  if stale_after > 0 then
    local now = now_ms()
    if now - (tonumber(w[1] or '0') or 0) > stale_after then return 1, now end
    return 0, now
  end
  return 0, 0
end
