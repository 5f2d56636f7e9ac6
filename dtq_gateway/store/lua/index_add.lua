-- index_add.lua: SADD members to one cross-queue index set (the busy-queue set
-- dtq:queues:busy, the dead-letter index dtq:queues:dead-letter).
--
-- A script rather than a plain SADD only for its allow-oom flag (scripts.py): the
-- reaper and the due-task mover find queues through these sets, so a member must be
-- added even while a full Redis refuses plain writes (one short set member each).
--
-- KEYS[1] the index set
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3..] members (queue names)
--
-- Reply: how many members were new (SADD's reply).

return redis.call('SADD', KEYS[1], unpack(ARGV, 3))
