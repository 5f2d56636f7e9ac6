-- chain_continued: record that a succeeded task's next chain step exists, and drop the
-- task from its queue's chain-pending set. Both keys belong to the task's queue.
-- The record is written only while it exists: a record that expired meanwhile must not
-- come back as a partial hash without a TTL.
-- KEYS[1] task hash dtq:task:{<slot>}:<id>  [2] chain-pending zset dtq:chains:pending:{<queue>}
-- ARGV[3] task id  [4] next step's task id ('' = no step will be created: only drop the
--         task from the pending set)  [5] chain error text ('' = none; recorded as
--         chain_error when the next step could not be built)
-- Reply: 1 when the record was updated, 0 when it no longer exists.
local task_key, pending_key = KEYS[1], KEYS[2]
redis.call('ZREM', pending_key, ARGV[3])
if redis.call('EXISTS', task_key) == 0 then return 0 end
if ARGV[4] ~= '' then redis.call('HSET', task_key, 'next_task_id', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', task_key, 'chain_error', ARGV[5]) end
return 1
