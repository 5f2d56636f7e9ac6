-- group_member: record one group member's terminal outcome, once.
-- A single-key script: the group record lives in the callback queue's slot while its
-- members may live anywhere, so each member's transition is recorded on its own
-- (idempotently) after the member's own script ended; the follow-up sweep repeats it
-- for members whose gateway died in between.
-- KEYS[1] group hash dtq:group:{<callback queue>}:<group id>
-- ARGV[3] member task id  [4] outcome JSON {"status", "error_class", "error"}
-- Reply: {done, total}: members recorded so far and members in the group (total is 0
-- while the group is still being created), or {-1, 0} when the group record is gone.
local group_key = KEYS[1]
if redis.call('EXISTS', group_key) == 0 then return {-1, 0} end
local done
if redis.call('HSETNX', group_key, 'm:' .. ARGV[3], ARGV[4]) == 1 then
  done = redis.call('HINCRBY', group_key, 'done', 1)
else
  done = tonumber(redis.call('HGET', group_key, 'done') or '0')
end
return {done, tonumber(redis.call('HGET', group_key, 'total') or '0')}
