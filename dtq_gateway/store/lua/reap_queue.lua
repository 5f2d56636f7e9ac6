-- reap_queue.lua: reaper step 1 for ONE busy queue. For each of its ten band streams
-- that holds entries it XAUTOCLAIMs the entries idle longer than the visibility timeout
-- to the reaper consumer and returns them with their fields; entries deleted while
-- pending are acked away here. When all ten streams and the queue's schedule are empty
-- the queue's busy marker is deleted in this same script, so no entry can slip in
-- between the check and the delete; the caller then removes the queue from the busy
-- set (dtq:queues:busy spans queues: a single-key SREM, followed by a re-check of the
-- marker, see store/reaping.py).
--
-- Empty streams cost one XLEN and nothing else. XLEN counts queued and leased entries
-- alike: every script that ends a lease acks AND deletes its entry, so XLEN 0 means
-- nothing to reclaim (a PEL id whose entry is already gone names no task).
--
-- XAUTOCLAIM runs with JUSTID and each id is read back with XRANGE, which gives one
-- reply shape on every Redis version: Redis 6.2 answers [cursor, ids] and keeps
-- deleted ids in the list (without JUSTID they would come back as bare nils with no
-- id to ack); Redis 7.x answers [cursor, ids, deleted ids] and already dropped the
-- deleted ones from the PEL. JUSTID also leaves the delivery counter alone.
--
-- KEYS[1..10] dtq:stream:{<queue>}:p9 .. p0
-- KEYS[11]    dtq:queue:{<queue>}:busy      (the queue's busy marker)
-- KEYS[12]    dtq:retry:{<queue>}:schedule  (a queue with scheduled tasks stays busy)
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")
-- ARGV[4] reaper consumer name
-- ARGV[5] min idle time (ms): the visibility timeout
-- ARGV[6] COUNT: most entries claimed per stream by this call
-- ARGV[7] queue name (the busy-set member)
-- ARGV[8..17] start cursor per stream, same order as KEYS ("0-0" to start over)
--
-- Reply: {removed, {index, next_cursor, {{entry_id, {field, value, ...}}, ...},
--          {deleted_id, ...}}, ...}
--   removed 1 = every stream and the schedule were empty and the busy marker was
--   deleted (no more items);
--   one item per non-empty stream, index 1..10 into KEYS; next_cursor "0-0" means the
--   scan of that stream's PEL wrapped around.
-- A stream without the group (after FLUSHALL an XADD recreates it bare) has nothing
-- pending: it is skipped (its item has cursor "0-0" and no entries).

local group, consumer, min_idle, count = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local reply = {0}
for i = 1, 10 do
  local stream_key = KEYS[i]
  if redis.call('XLEN', stream_key) > 0 then
    local r = redis.pcall('XAUTOCLAIM', stream_key, group, consumer, min_idle, ARGV[7 + i],
      'COUNT', count, 'JUSTID')
    if type(r) == 'table' and r.err then
      reply[#reply + 1] = {i, '0-0', {}, {}}
    else
      local entries, deleted = {}, {}
      for _, id in ipairs(r[2]) do
        local e = redis.call('XRANGE', stream_key, id, id)
        if #e == 0 then
          deleted[#deleted + 1] = id
        else
          entries[#entries + 1] = {id, e[1][2]}
        end
      end
      if r[3] then
        for _, id in ipairs(r[3]) do deleted[#deleted + 1] = id end
      end
      for _, id in ipairs(deleted) do redis.call('XACK', stream_key, group, id) end
      reply[#reply + 1] = {i, r[1], entries, deleted}
    end
  end
end
if #reply == 1 and redis.call('ZCARD', KEYS[12]) == 0 then
  redis.call('DEL', KEYS[11])
  reply[1] = 1
end
return reply
