-- worker_check: may this worker get new leases? Read with every lease_take of its
-- sessions on Redis Cluster (same pipeline): the worker's record is in the {workers}
-- hash slot, the queues' streams each in their own, so the check is its own script
-- there. On a standalone or Sentinel-managed Redis lease_take runs the same check
-- itself (its ARGV[14+t+m]). Also the heartbeat look-up of stream health.
-- KEYS[1] the worker's record dtq:worker:{workers}:<id>
-- ARGV[3] stale after (ms): a worker whose last heartbeat is older than this gets
--         nothing (0 = no check)
-- Reply: 0 = ok, 1 = stalled (no recent heartbeat), 2 = draining (end its sessions)
-- (worker_state, _worker_state.lua).
local state = worker_state(KEYS[1], tonumber(ARGV[3]))
return state
