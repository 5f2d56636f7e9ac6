-- delete_idle_queue.lua: delete ONE drained queue's band streams once nothing has used
-- them for a while (the idle-queue sweep, queue_sweep.py). All checks and the deletes
-- run in this one script, so no entry or read can slip in between.
--
-- Kept (reply 0) when any of: the queue is paused (an operator's setting); its busy
-- marker is set (work queued or scheduled, whatever dtq:queues:busy says); a stream
-- holds an entry (queued or leased); a stream's newest entry ever added is younger
-- than the idle time; a consumer of a stream interacted (read or tried to read) more
-- recently than the idle time (a worker listening on the queue); a group has pending
-- ids. Otherwise the ten streams (with their group and consumers) are deleted.
--
-- KEYS[1..10] dtq:stream:{<queue>}:p9 .. p0
-- KEYS[11]    dtq:queue:{<queue>}:paused
-- KEYS[12]    dtq:queue:{<queue>}:busy (all twelve keys in the queue's hash slot)
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")
-- ARGV[4] idle time (ms)
-- Reply: 1 = deleted (or nothing was there), 0 = kept
local group, idle = ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[11]) == 1 or redis.call('EXISTS', KEYS[12]) == 1 then
  return 0
end
local now = now_ms()
for i = 1, 10 do
  local s = KEYS[i]
  if redis.call('EXISTS', s) == 1 then
    if redis.call('XLEN', s) > 0 then return 0 end
    local info = redis.call('XINFO', 'STREAM', s)
    for j = 1, #info, 2 do
      if info[j] == 'last-generated-id' then
        local ms = tonumber(string.match(info[j + 1], '^(%d+)')) or 0
        if now - ms < idle then return 0 end
      end
    end
    local groups = redis.pcall('XINFO', 'GROUPS', s)
    if type(groups) == 'table' and not groups.err then
      for _, g in ipairs(groups) do
        for j = 1, #g, 2 do
          if g[j] == 'pending' and tonumber(g[j + 1]) > 0 then return 0 end
        end
      end
      local consumers = redis.pcall('XINFO', 'CONSUMERS', s, group)
      if type(consumers) == 'table' and not consumers.err then
        for _, c in ipairs(consumers) do
          for j = 1, #c, 2 do
            if c[j] == 'idle' and tonumber(c[j + 1]) < idle then return 0 end
          end
        end
      end
    end
  end
end
for i = 1, 10 do redis.call('DEL', KEYS[i]) end
return 1
