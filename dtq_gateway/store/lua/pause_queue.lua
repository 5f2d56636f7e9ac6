-- pause_queue.lua: pause or resume a queue, with its event, atomically. The caller
-- appends the audit entry right after (the audit stream spans queues).
-- KEYS[1]  pause flag of the queue (dtq:queue:{<q>}:paused)
-- ARGV[1..2] events channel, event id prefix (_lib.lua convention)
-- ARGV[3]  "pause" or "resume"
-- ARGV[4]  approximate MAXLEN of the audit stream (entries)
-- ARGV[5]  actor   ARGV[6] request_id   ARGV[7] reason (free text)   ARGV[8] queue name
-- Reply: {changed (1 = the flag changed, 0 = it already had that value), ts (epoch ms)}
-- A change publishes CONFIGURATION_CHANGED {queue, metadata {paused, actor}}; the
-- caller audits every call (changed or not), action pause_queue / resume_queue.
local ms = now_ms()
local pause = ARGV[3] == 'pause'
local changed
if pause then
  changed = redis.call('SET', KEYS[1], '1', 'NX') and 1 or 0
else
  changed = redis.call('DEL', KEYS[1])
end
if changed == 1 then
  publish('CONFIGURATION_CHANGED', ms, '', ARGV[8], '', 0, '',
    {paused = pause and 'true' or 'false', actor = ARGV[5]})
end
return {changed, ms}
