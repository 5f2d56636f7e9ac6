-- worker_states: the status field of many worker records in one call (the dispatcher's
-- tick asks for the workers of the Lease sessions it skipped, to end the streams of
-- workers draining through another replica).
-- KEYS[1..n] worker records dtq:worker:<id>
-- Reply: {status or '' (record missing), ...} in KEYS order
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HGET', KEYS[i], 'status') or ''
end
return out
