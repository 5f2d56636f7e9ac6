-- autoclaim.lua: reaper step 1 for one band stream. XAUTOCLAIMs entries idle longer
-- than the visibility timeout to the reaper consumer and returns them with their
-- fields; entries deleted while pending are acked away here.
--
-- XAUTOCLAIM runs with JUSTID and each id is read back with XRANGE, which gives one
-- reply shape on every Redis version: Redis 6.2 answers [cursor, ids] and keeps
-- deleted ids in the list (without JUSTID they would come back as bare nils with no
-- id to ack); Redis 7.x answers [cursor, ids, deleted ids] and already dropped the
-- deleted ones from the PEL. JUSTID also leaves the delivery counter alone.
--
-- KEYS[1] dtq:stream:<queue>:p<n>
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")
-- ARGV[4] reaper consumer name
-- ARGV[5] min idle time (ms): the visibility timeout
-- ARGV[6] start cursor (stream id, "0-0" to start over)
-- ARGV[7] COUNT: most entries claimed by this call
--
-- Reply: {next_cursor, {{entry_id, {field, value, ...}}, ...}, {deleted_id, ...}}
--   next_cursor "0-0" means the scan of the PEL wrapped around.
-- Errors: NOGROUP when the stream or its group does not exist (after FLUSHALL).

local stream_key, group = KEYS[1], ARGV[3]
local r = redis.call('XAUTOCLAIM', stream_key, group, ARGV[4], ARGV[5], ARGV[6],
  'COUNT', ARGV[7], 'JUSTID')
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
return {r[1], entries, deleted}
