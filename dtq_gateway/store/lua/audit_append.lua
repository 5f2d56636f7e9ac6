-- audit_append.lua: append one audit entry (no state change of its own).
-- KEYS[1]  audit stream (dtq:stream:audit)
-- ARGV[1..2] events channel, event id prefix (unused; _lib.lua convention)
-- ARGV[3]  approximate MAXLEN of the audit stream (entries)
-- ARGV[4]  actor   ARGV[5] action   ARGV[6] task_id (or queue name, or "")
-- ARGV[7]  request_id   ARGV[8] detail
-- Reply: {entry id, ts (epoch ms, Redis TIME)}
local ms = now_ms()
local id = audit(KEYS[1], ARGV[3], ms, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return {id, ms}
