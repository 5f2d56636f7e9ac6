-- worker_beat: refresh a worker's liveness record; optionally mark start/stop.
-- KEYS[1] worker hash dtq:worker:<id>  [2] known workers set dtq:workers
-- ARGV[3] worker id  [4] hostname  [5] TTL ms (3 x heartbeat interval)
-- ARGV[6] event: '' | 'started' | 'stopped' | 'draining' (status draining: no new leases)  [7] active tasks  [8] concurrency
-- ARGV[9] tasks_processed  [10] tasks_failed  [11] tasks_retried  [12] '1' = counters given
-- ARGV[13] gateway tag (keys.gateway_tag) for 'started' / 'stopped': the field
--          leasing@<tag> counts the worker's open Lease streams on that gateway
-- ARGV[14] owner tag (leaseid.owner_tag of the caller's identity): the first beat of a
--          record binds the worker id to it; a beat with another tag changes nothing
-- ARGV[15] '1' = the session's registration follows (with 'started'): [16] labels JSON
--          object  [17] queues, comma-separated  [18] task type filter, comma-separated
--          ('' = every type); stored as fields labels, queues, task_types
-- Reply: now (epoch ms), or 'denied' when the record is bound to another owner
local key, worker = KEYS[1], ARGV[3]
local owner = redis.call('HGET', key, 'owner')
if owner and ARGV[14] and owner ~= ARGV[14] then return 'denied' end
local now = now_ms()
if ARGV[14] then redis.call('HSET', key, 'owner', ARGV[14]) end
redis.call('HSETNX', key, 'started_at', now)
-- 'draining' sticks until a new session starts: neither the end of the draining
-- worker's stream ('stopped') nor a plain heartbeat already in flight may let another
-- replica lease to it again.
local current = redis.call('HGET', key, 'status')
local status = 'alive'
if ARGV[6] == 'draining' or (current == 'draining' and ARGV[6] ~= 'started') then
  status = 'draining'
elseif ARGV[6] == 'stopped' then
  status = 'stopped'
end
redis.call('HSET', key, 'worker_id', worker, 'last_heartbeat', now, 'status', status)
if ARGV[4] ~= '' then redis.call('HSET', key, 'hostname', ARGV[4]) end
if ARGV[7] ~= '' then redis.call('HSET', key, 'active_tasks', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', key, 'concurrency', ARGV[8]) end
if ARGV[15] == '1' then
  redis.call('HSET', key, 'labels', ARGV[16], 'queues', ARGV[17], 'task_types', ARGV[18])
end
if ARGV[12] == '1' then
  redis.call('HSET', key, 'tasks_processed', ARGV[9], 'tasks_failed', ARGV[10],
    'tasks_retried', ARGV[11])
end
local tag = ARGV[13]
if tag and tag ~= '' then
  if ARGV[6] == 'started' then
    redis.call('HINCRBY', key, 'leasing@' .. tag, 1)
  elseif ARGV[6] == 'stopped' and redis.call('HINCRBY', key, 'leasing@' .. tag, -1) <= 0 then
    redis.call('HDEL', key, 'leasing@' .. tag)
  end
end
redis.call('PEXPIRE', key, tonumber(ARGV[5]))
redis.call('SADD', KEYS[2], worker)
if ARGV[6] == 'started' then
  publish('WORKER_STARTED', now, '', '', '', 0, worker, nil)
elseif ARGV[6] == 'stopped' then
  publish('WORKER_STOPPED', now, '', '', '', 0, worker, nil)
end
return now
