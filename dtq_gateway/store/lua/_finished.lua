-- _finished.lua: the count retention (DTQ_KEEP_FINISHED) shared by ack.lua and the
-- bulk cancel. A queue's finished index dtq:finished:{<queue>} (keys.finished) holds the
-- ids of its succeeded and cancelled tasks scored by their finish time in microseconds
-- (Redis TIME, plus the task's position in its call, so the order of one call's tasks
-- is kept and a trim drops the oldest, not an arbitrary tie); each script that
-- finishes tasks adds them and trims the index to the newest `keep`, deleting the task
-- records and results it pops.

-- The record and result keys of a task id, as keys.task / keys.result build them
-- (tests/unit/test_finished_keys.py checks that they agree). A tagged id's keys carry
-- its slot tag, the slot of its queue (and of the index), so the keys this builds are
-- in the calling script's slot; the untagged ids of the older layout exist on a
-- standalone Redis only.
local function finished_task_keys(task_id)
  local tag = string.match(task_id, '%-([0-9a-z]+)$')
  if tag then
    return 'dtq:task:{' .. tag .. '}:' .. task_id, 'dtq:result:{' .. tag .. '}:' .. task_id
  end
  return 'dtq:task:' .. task_id, 'dtq:result:' .. task_id
end

local TERMINAL = {succeeded = true, cancelled = true, dead_lettered = true, expired = true}

-- Add `ids` (finished now, in this order) to the index and delete the oldest members beyond `keep`:
-- at most #ids + 64 per call, so the work per call is bounded and a backlog (after N
-- was lowered) drains over the following calls. A popped id whose record is live again
-- (a redriven task) keeps its record. Returns the number of records deleted.
local function keep_finished(index_key, keep, ids)
  if keep <= 0 or #ids == 0 then return 0 end
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local zargs = {}
  for i = 1, #ids do zargs[2 * i - 1] = us + i - 1; zargs[2 * i] = ids[i] end
  redis.call('ZADD', index_key, unpack(zargs))
  local over = redis.call('ZCARD', index_key) - keep
  if over <= 0 then return 0 end
  if over > #ids + 64 then over = #ids + 64 end
  local old = redis.call('ZPOPMIN', index_key, over)
  local deleted = 0
  for i = 1, #old, 2 do
    local task_key, result_key = finished_task_keys(old[i])
    local status = redis.call('HGET', task_key, 'status')
    if not status or TERMINAL[status] then
      if redis.call('DEL', task_key, result_key) > 0 then deleted = deleted + 1 end
    end
  end
  return deleted
end
