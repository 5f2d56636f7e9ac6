-- lock_refresh.lua: compare-and-set refresh of the scheduler leader lock.
--
-- KEYS[1] dtq:lock:scheduler
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] lock token of the caller
-- ARGV[4] lock TTL (ms)
--
-- Reply: 1 when the caller holds the lock (PEXPIRE applied), 0 otherwise (untouched).

if redis.call('GET', KEYS[1]) == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
  return 1
end
return 0
