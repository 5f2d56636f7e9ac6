-- discard_dead_letter.lua: remove a task's dead-letter entry; the task keeps status
-- dead_lettered and gains discarded=1 (shown as metadata discarded=true).
-- Both keys are of the task's queue (one hash slot); the caller appends the audit entry.
-- KEYS[1]  task hash (dtq:task:{<tag>}:<id>)
-- KEYS[2]  the queue's dead-letter stream (dtq:stream:{<q>}:dead-letter)
-- KEYS[3]  unused (the task hash again)
-- ARGV[1..2] events channel, event id prefix (_lib.lua convention)
-- ARGV[3..5] unused (audit MAXLEN, actor, request id)   ARGV[6] task retention (s)
-- Reply: {"OK", ts (epoch ms)} or {"NOT_FOUND"} (no hash), {"NO_ENTRY"} (already
--     discarded, purged or trimmed), {"WRONG_STATE", status}.
local task_key = KEYS[1]
if redis.call('EXISTS', task_key) == 0 then return {'NOT_FOUND'} end
local f = redis.call('HMGET', task_key, 'status', 'dlq_entry_id', 'discarded', 'task_id')
if f[1] ~= 'dead_lettered' then return {'WRONG_STATE', f[1] or ''} end
if (not f[2]) or f[2] == '' or f[3] == '1' then return {'NO_ENTRY'} end
if redis.call('XDEL', KEYS[2], f[2]) == 0 then return {'NO_ENTRY'} end
local ms = now_ms()
redis.call('HSET', task_key, 'discarded', '1', 'dlq_entry_id', '')
retire(task_key, ms, ARGV[6])
return {'OK', ms}
