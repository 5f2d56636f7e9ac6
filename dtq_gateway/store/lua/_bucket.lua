-- _bucket.lua: token buckets of rate limits (prepended by the scripts that use them).
-- A queue's limits live in ONE hash, dtq:queue:{<q>}:ratelimit (docs/redis-layout.md).
-- A scope is '*' (the whole queue) or a task type (whose alphabet has no '|' or '*'):
--   cfg|<scope>  "limit period_ms burst"   (integers; limit tokens per period_ms)
--   tok|<scope>  tokens left at ts|<scope> (decimal string, fractional)
--   ts|<scope>   epoch ms (Redis TIME) of that level
--   types        number of task-type limits (absent when 0)
-- Tokens refill evenly at limit / period_ms per ms, up to burst; a lease takes one.

-- Level of a bucket at `now` (ms): tokens, limit, period_ms, burst; nil = no limit.
local function bucket_level(key, scope, now)
  local f = redis.call('HMGET', key, 'cfg|' .. scope, 'tok|' .. scope, 'ts|' .. scope)
  if not f[1] then return nil end
  local limit, period, burst = string.match(f[1], '^(%d+) (%d+) (%d+)$')
  limit, period, burst = tonumber(limit), tonumber(period), tonumber(burst)
  local tok, ts = tonumber(f[2]), tonumber(f[3])
  if not tok or not ts then return burst, limit, period, burst end
  if now > ts then tok = math.min(burst, tok + (now - ts) * limit / period) end
  return tok, limit, period, burst
end

-- Store a level (a Lua number would be truncated to an integer by redis.call).
local function bucket_store(key, scope, tok, now)
  redis.call('HSET', key, 'tok|' .. scope, string.format('%.6f', tok), 'ts|' .. scope, now)
end

-- ms until a bucket at level `tok` (< 1) holds one whole token again.
local function bucket_wait_ms(tok, limit, period)
  return math.max(1, math.ceil((1 - tok) * period / limit))
end
