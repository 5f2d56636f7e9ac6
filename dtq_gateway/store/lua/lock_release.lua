-- lock_release.lua: compare-and-delete of the scheduler leader lock (graceful stop).
--
-- KEYS[1] dtq:lock:scheduler
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] lock token of the caller
--
-- Reply: 1 when the caller held the lock and it was deleted, 0 otherwise (untouched).

if redis.call('GET', KEYS[1]) == ARGV[3] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
