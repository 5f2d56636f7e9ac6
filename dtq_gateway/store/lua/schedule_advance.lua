-- schedule_advance.lua: record the progress of a schedule's fires (scheduler leader).
-- Touches the schedule's own hash only; the fire itself was enqueued just before with
-- the idempotency key schedule:<name>:<fire ms>, so a leader that dies between the two
-- steps makes its successor enqueue the same fire again, which is deduplicated.
-- KEYS[1] the schedule  dtq:schedule:<name>
-- ARGV[3] generation the caller read (changes when the schedule is replaced)
-- ARGV[4] done_ms: every fire at or before it is handled (epoch ms; never moves back)
-- ARGV[5] fire_ms of the fire just enqueued (0 = none)  ARGV[6] its task id
-- ARGV[7] next fire (epoch ms)
-- Reply: 'ok' | 'gone' (deleted) | 'stale' (replaced) | 'paused' (nothing changed)
local f = redis.call('HMGET', KEYS[1], 'gen', 'done_ms', 'paused', 'last_fire_ms')
if not f[1] then return 'gone' end
if f[1] ~= ARGV[3] then return 'stale' end
if f[3] == '1' then return 'paused' end
local done, fire = tonumber(ARGV[4]), tonumber(ARGV[5])
if done > (tonumber(f[2]) or 0) then redis.call('HSET', KEYS[1], 'done_ms', ARGV[4]) end
if fire > 0 and fire > (tonumber(f[4]) or 0) then
  redis.call('HSET', KEYS[1], 'last_fire_ms', ARGV[5], 'last_task_id', ARGV[6])
  redis.call('HINCRBY', KEYS[1], 'fires_total', 1)
end
redis.call('HSET', KEYS[1], 'next_fire_ms', ARGV[7])
return 'ok'
