-- dlq_scan.lua: one page of a queue's dead-letter stream without payloads (for filters
-- and counts, so large payloads never cross the wire).
-- KEYS[1]  the queue's dead-letter stream (dtq:stream:{<queue>}:dead-letter)
-- ARGV[1..2] events channel, event id prefix (unused; _lib.lua convention)
-- ARGV[3]  "rev" (newest first, XREVRANGE) or "fwd" (oldest first, XRANGE)
-- ARGV[4]  exclusive start entry id, "" = from the newest (rev) / oldest (fwd);
--          "=<id>" = inclusive start (a merged listing's tie on the entry id)
-- ARGV[5]  page size (entries)
-- Reply: flat array, 7 items per entry: entry id, task_id, queue, task_type,
--     last_error_class, failed_at_ms, attempts_made
local entries
local start = ARGV[4]
if string.sub(start, 1, 1) == '=' then start = string.sub(start, 2)
elseif start ~= '' then start = '(' .. start end
if ARGV[3] == 'rev' then
  entries = redis.call('XREVRANGE', KEYS[1], start == '' and '+' or start, '-',
    'COUNT', ARGV[5])
else
  entries = redis.call('XRANGE', KEYS[1], start == '' and '-' or start, '+',
    'COUNT', ARGV[5])
end
local out = {}
for _, e in ipairs(entries) do
  local m = {}
  local kv = e[2]
  for i = 1, #kv, 2 do m[kv[i]] = kv[i + 1] end
  for _, v in ipairs({e[1], m.task_id or '', m.queue or '', m.task_type or '',
      m.last_error_class or '', m.failed_at_ms or '0', m.attempts_made or '0'}) do
    table.insert(out, v)
  end
end
return out
