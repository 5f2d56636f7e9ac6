-- rate_limit_set.lua: set, change or remove one rate limit of a queue (Admin).
-- KEYS[1] rate limits of the queue  dtq:queue:{<q>}:ratelimit (see _bucket.lua)
-- ARGV[3] scope ('*' = whole queue, else a task type)
-- ARGV[4] "limit period_ms burst" to set or change; '' to remove
-- ARGV[5] queue name (for the event)   ARGV[6] actor
-- Reply: 'created' | 'changed' | 'deleted' | 'missing' (nothing to remove), and, as a
--        second item, 1 when the hash is gone (the queue has no limit left)
-- A new limit starts with a full bucket; a changed one keeps its level, capped at the
-- new burst. Any change publishes CONFIGURATION_CHANGED {queue, rate_limit, scope} so
-- every gateway's dispatcher reads the queue again at once.
local key, scope, cfg = KEYS[1], ARGV[3], ARGV[4]
local now = now_ms()
local old = redis.call('HGET', key, 'cfg|' .. scope)
local outcome
if cfg == '' then
  if not old then return {'missing', redis.call('EXISTS', key) == 0 and 1 or 0} end
  redis.call('HDEL', key, 'cfg|' .. scope, 'tok|' .. scope, 'ts|' .. scope)
  if scope ~= '*' and redis.call('HINCRBY', key, 'types', -1) <= 0 then
    redis.call('HDEL', key, 'types')
  end
  outcome = 'deleted'
else
  local burst = tonumber(string.match(cfg, ' (%d+)$'))
  local tok = burst
  if old then
    tok = math.min(burst, (bucket_level(key, scope, now)))
    outcome = 'changed'
  else
    if scope ~= '*' then redis.call('HINCRBY', key, 'types', 1) end
    outcome = 'created'
  end
  redis.call('HSET', key, 'cfg|' .. scope, cfg)
  bucket_store(key, scope, tok, now)
end
publish('CONFIGURATION_CHANGED', now, '', ARGV[5], '', 0, '',
  {rate_limit = cfg == '' and 'removed' or cfg, scope = scope, actor = ARGV[6]})
return {outcome, redis.call('EXISTS', key) == 0 and 1 or 0}
