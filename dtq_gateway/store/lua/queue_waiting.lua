-- queue_waiting.lua: the tasks waiting in one queue's bands, by task type (GetQueueStats).
-- Reads the entries after each band's consumer-group last-delivered-id (the ones no
-- session has read yet), band p9 first, oldest first within a band, at most ARGV[4]
-- in all (each read entry is copied into the script, payload included, so the bound
-- keeps the call short), and returns only per task type how many wait and since when. Entries put back unleased (a
-- session that does not take their type read them) keep their first wait time in the
-- queued_at field.
-- KEYS[1..10] dtq:stream:{<queue>}:p9 .. p0 (one queue)
-- ARGV[1] events channel, ARGV[2] event-id prefix (unused; _lib.lua convention)
-- ARGV[3] consumer group ("workers")  [4] most entries read in all (1..)
-- Reply: {entries read, complete (1 = every waiting entry was read), then per task type
--         and required labels {task_type, waiting entries, oldest wait start (epoch ms),
--         required labels JSON ('' = none; docs/fairness.md)}, ...}
local group, limit = ARGV[3], tonumber(ARGV[4])
local by_type, order = {}, {}
local read, complete = 0, 1

local function last_delivered(stream)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then return nil end
  for _, g in ipairs(groups) do
    local name, last
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] end
      if g[j] == 'last-delivered-id' then last = g[j + 1] end
    end
    if name == group then return last end
  end
  return nil
end

for _, stream in ipairs(KEYS) do
  if redis.call('XLEN', stream) > 0 then
    local last = last_delivered(stream)
    local start = (last and last ~= '0-0') and ('(' .. last) or '-'
    local budget = limit - read
    local entries = budget > 0 and redis.call('XRANGE', stream, start, '+', 'COUNT',
      budget + 1) or redis.call('XRANGE', stream, start, '+', 'COUNT', 1)
    if #entries > budget then complete = 0 end
    for e = 1, math.min(#entries, budget) do
      local id, f = entries[e][1], entries[e][2]
      local task_type, queued, labels = '', nil, ''
      for j = 1, #f, 2 do
        if f[j] == 'task_type' then task_type = f[j + 1]
        elseif f[j] == 'queued_at' then queued = tonumber(f[j + 1])
        elseif f[j] == 'req_labels' then labels = f[j + 1] end
      end
      queued = queued or tonumber(string.match(id, '^(%d+)'))
      local group_key = task_type .. '\n' .. labels
      local t = by_type[group_key]
      if not t then
        t = {task_type, 0, queued, labels}
        by_type[group_key] = t
        order[#order + 1] = group_key
      end
      t[2] = t[2] + 1
      if queued < t[3] then t[3] = queued end
      read = read + 1
    end
  end
end
local reply = {read, complete}
for _, name in ipairs(order) do reply[#reply + 1] = by_type[name] end
return reply
