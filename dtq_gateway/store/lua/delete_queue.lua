-- delete_queue.lua: delete ONE queue's keys on an operator's request (Admin.DeleteQueue),
-- only when it is drained. The explicit counterpart of delete_idle_queue.lua: all
-- checks and the deletes run in this one script, so no enqueue, lease or schedule move
-- can slip in between. Unlike the idle sweep it does not wait for an idle time (a
-- queue drained a second ago may go) nor for its consumers to be idle (a worker that
-- listens on an empty queue touches none of its keys, see lease_take.lua: it keeps
-- listening and gets the name's next task), it ignores the busy marker and reads the
-- real contents instead, a paused queue is deleted too (the operator asked), and it
-- deletes every key of the queue's slot that has a fixed name, not only the streams.
--
-- Refused (nothing changed) with, in this order:
--   'not_empty'    a band stream holds an entry (queued or leased), a group has pending
--                  ids, the schedule holds a task (delayed or retry), or a chain step
--                  or a group callback of the queue is still owed;
--   'dead_letters' the dead-letter stream holds entries and ARGV[3] is not "1".
-- Else 'absent' when none of the keys exists, 'dry_run' when ARGV[4] is "1" (the reply
-- lists what would go), else every key that exists is deleted: 'deleted'.
--
-- KEYS[1..10] dtq:stream:{<queue>}:p9 .. p0
-- KEYS[11] dtq:retry:{<queue>}:schedule     KEYS[12] dtq:stream:{<queue>}:dead-letter
-- KEYS[13] dtq:queue:{<queue>}:paused       KEYS[14] dtq:queue:{<queue>}:busy
-- KEYS[15] dtq:queue:{<queue>}:counters     KEYS[16] dtq:queue:{<queue>}:ratelimit
-- KEYS[17] dtq:cancelled:{<queue>}          KEYS[18] dtq:chains:pending:{<queue>}
-- KEYS[19] dtq:groups:pending:{<queue>}     KEYS[20] dtq:expiring:{<queue>}
-- KEYS[21] dtq:finished:{<queue>} (DTQ_KEEP_FINISHED's index)
-- (all in the queue's hash slot)
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] "1" = delete the dead letters too   ARGV[4] "1" = dry run
-- Reply: {outcome, depth, pending, scheduled, followups, dead letters, {existing keys}}
local depth, pending = 0, 0
for i = 1, 10 do
  local s = KEYS[i]
  if redis.call('EXISTS', s) == 1 then
    depth = depth + redis.call('XLEN', s)
    local groups = redis.pcall('XINFO', 'GROUPS', s)
    if type(groups) == 'table' and not groups.err then
      for _, g in ipairs(groups) do
        for j = 1, #g, 2 do
          if g[j] == 'pending' then pending = pending + tonumber(g[j + 1]) end
        end
      end
    end
  end
end
local scheduled = redis.call('ZCARD', KEYS[11])
local followups = redis.call('ZCARD', KEYS[18]) + redis.call('ZCARD', KEYS[19])
local dead = 0
if redis.call('EXISTS', KEYS[12]) == 1 then dead = redis.call('XLEN', KEYS[12]) end
local existing = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then existing[#existing + 1] = KEYS[i] end
end
local function reply(outcome)
  return {outcome, depth, pending, scheduled, followups, dead, existing}
end
if depth > 0 or pending > 0 or scheduled > 0 or followups > 0 then
  return reply('not_empty')
end
if dead > 0 and ARGV[3] ~= '1' then return reply('dead_letters') end
if #existing == 0 then return reply('absent') end
if ARGV[4] == '1' then return reply('dry_run') end
for _, k in ipairs(existing) do redis.call('DEL', k) end
return reply('deleted')
