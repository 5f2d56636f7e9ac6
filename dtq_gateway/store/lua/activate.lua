-- activate: turn entries read by lease_take but left unactivated into active leases, or absorb them
-- (the two-step path: entries of queues with task-type rate limits, whose tokens the
-- dispatcher takes between the read and this call, and entries put back because their
-- worker may take nothing). Each entry: activate_entry (_activate.lua). One events
-- message per call.
-- Every entry of one call is of ONE queue (one hash slot; the dispatcher calls once per
-- queue).
-- KEYS[1]   the queue's cancelled set dtq:cancelled:{<queue>}
-- per entry i (3 keys): band stream, task hash, idempotency record (or the task hash
--           again when the task has no idempotency key)
-- KEYS[#KEYS] the queue's expiry index dtq:expiring:{<queue>}: a task with an expiry
--           leaves it when it starts or expires here
-- ARGV[3] consumer (worker id)  [4] task retention s  [5] group
-- per entry i (5 args from ARGV[6]): entry id, task id, entry attempt, mode, queued at
--   mode 'a' = activate, 'r' = put back at the tail (task type not wanted by the session)
--   queued at: epoch ms the task began to wait (the entry's queued_at field, else its id
--   time); the put-back entry carries it as queued_at ('' with mode 'a')
-- Reply per entry: {'ok', content_type, metadata JSON, created_at_ms, leased_at_ms}
--   | {'absorbed'} | {'cancelled'} | {'expired'} | {'requeued'}
local consumer, retention, group = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local out = {}
local n = (#KEYS - 2) / 3
for i = 1, n do
  local a = 6 + 5 * (i - 1)
  local idem_key = KEYS[3 * i + 1]
  if idem_key == KEYS[3 * i] then idem_key = nil end
  out[i] = activate_entry({cancelled = KEYS[1], expiring = KEYS[#KEYS],
    stream = KEYS[3 * i - 1], task_key = KEYS[3 * i], idem_key = idem_key, id = ARGV[a],
    task_id = ARGV[a + 1], attempt = tonumber(ARGV[a + 2]), mode = ARGV[a + 3],
    queued_at = ARGV[a + 4]}, consumer, retention, group, now)
end
return out
