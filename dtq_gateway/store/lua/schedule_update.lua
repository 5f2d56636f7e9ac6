-- schedule_update.lua: set fields of a schedule only if it exists (pause, resume, the
-- task id of a manual trigger), so a call racing a delete never leaves a partial hash.
-- KEYS[1] the schedule  dtq:schedule:<name>
-- ARGV[3..] field, value pairs
-- Reply: 1 = updated, 0 = no such schedule
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
return 1
