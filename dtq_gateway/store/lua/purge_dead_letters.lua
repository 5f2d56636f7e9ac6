-- purge_dead_letters.lua: remove every dead-letter entry (exact trim to 0) and
-- audit it. Task hashes keep status dead_lettered; their dlq_entry_id now names
-- no entry, so RequeueDeadLetter / DiscardDeadLetter answer NOT_FOUND for them.
-- KEYS[1]  dead-letter stream (dtq:stream:dead-letter)
-- KEYS[2]  audit stream (dtq:stream:audit)
-- ARGV[1..2] events channel, event id prefix (_lib.lua convention)
-- ARGV[3]  approximate MAXLEN of the audit stream (entries)
-- ARGV[4]  actor   ARGV[5] request_id
-- Reply: {entries removed, ts (epoch ms)}
local ms = now_ms()
local n = redis.call('XTRIM', KEYS[1], 'MAXLEN', '=', 0)
audit(KEYS[2], ARGV[3], ms, ARGV[4], 'purge_dead_letters', '', ARGV[5], 'purged=' .. n)
return {n, ms}
