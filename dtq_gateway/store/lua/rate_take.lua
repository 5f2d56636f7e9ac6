-- rate_take.lua: take (or give back) tokens of a queue's rate-limit buckets.
-- The dispatcher calls it for the entries of a queue with task-type limits that a
-- lease_take left unactivated (one take per type, before activation; entries beyond the grant
-- are put back at the tail of their stream, still queued, no attempt spent), and to
-- give back tokens taken for entries it did not deliver (absorbed, cancelled, wrong
-- type for the session).
-- KEYS[1] rate limits of the queue  dtq:queue:{<q>}:ratelimit
-- ARGV[3..] pairs: scope ('*' = whole queue, else a task type), n (> 0: take up to n;
--           < 0: give back -n, up to the burst)
-- Reply: one {granted, wait_ms} per pair: granted = n when the scope has no limit;
--        wait_ms = ms until the next token when less than n was granted, else 0;
--        a give-back answers {0, 0}
local now = now_ms()
local out = {}
for i = 3, #ARGV, 2 do
  local scope, n = ARGV[i], tonumber(ARGV[i + 1])
  local tok, limit, period, burst = bucket_level(KEYS[1], scope, now)
  if not tok then
    out[#out + 1] = {math.max(n, 0), 0}
  elseif n < 0 then
    bucket_store(KEYS[1], scope, math.min(burst, tok - n), now)
    out[#out + 1] = {0, 0}
  else
    local granted = math.max(0, math.min(n, math.floor(tok)))
    tok = tok - granted
    bucket_store(KEYS[1], scope, tok, now)
    local wait = 0
    if granted < n then wait = bucket_wait_ms(tok, limit, period) end
    out[#out + 1] = {granted, wait}
  end
end
return out
