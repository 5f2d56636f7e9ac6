-- task_summaries.lua: several task hashes without their payloads (listings).
-- KEYS[1..n]  task hashes (dtq:task:{<slot>}:<id>)
-- ARGV[1..2]  events channel, event id prefix (unused; _lib.lua convention)
-- Reply: one array per key, HGETALL-style field/value pairs without "payload"
--     (empty array when the hash is gone).
local out = {}
for i, key in ipairs(KEYS) do
  local kv = redis.call('HGETALL', key)
  local row = {}
  for j = 1, #kv, 2 do
    if kv[j] ~= 'payload' then
      table.insert(row, kv[j])
      table.insert(row, kv[j + 1])
    end
  end
  out[i] = row
end
return out
