-- lock_take.lua: take the scheduler leader lock when it is free (SET NX PX).
--
-- A script rather than a plain SET only for its allow-oom flag (scripts.py): a replica
-- must be able to become the leader while Redis is full, since the leader moves due
-- retries and reclaims expired leases, which drain it.
--
-- KEYS[1] dtq:lock:scheduler
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] lock token of the caller
-- ARGV[4] TTL of the lock (ms)
--
-- Reply: 1 when the lock was free and now holds the token, 0 otherwise (untouched).

if redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ARGV[4]) then
  return 1
end
return 0
