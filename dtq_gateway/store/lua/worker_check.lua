-- worker_check: may this worker get new leases? Read with every lease_take of its
-- sessions (same pipeline): the worker's record is in the {workers} hash slot, the
-- queues' streams each in their own, so the check is its own script.
-- KEYS[1] the worker's record dtq:worker:{workers}:<id>
-- ARGV[3] stale after (ms): a worker whose last heartbeat is older than this gets
--         nothing (0 = no check)
-- Reply: 0 = ok, 1 = stalled (no recent heartbeat), 2 = draining (end its sessions)
-- A stalled worker (SIGSTOPped, GC-paused, partitioned with its stream still open) would
-- otherwise receive new leases as the reaper takes its old ones away, and burn an
-- attempt of each: it only gets work again once it heartbeats.
local w = redis.call('HMGET', KEYS[1], 'last_heartbeat', 'status')
if w[2] == 'draining' then return 2 end
local stale_after = tonumber(ARGV[3])
if stale_after > 0 and now_ms() - (tonumber(w[1] or '0') or 0) > stale_after then
  return 1
end
return 0
