-- _concurrency.lua: per-key concurrency (docs/fairness.md), shared by the scripts that
-- start a lease (activate) and every script that ends one (ack, fail, reclaim) or
-- takes a waiting task away (cancel, cancel_matching, expire_waiting). Needs
-- _finished.lua (finished_task_keys) before it.
--
-- A task may carry a concurrency key (record field ckey, '' = none). Per queue, in the
-- queue's hash slot (keys.concurrency_*; the names are built here from the queue name):
--   dtq:conc:{<q>}:limit          the most active tasks per key (absent = no limit)
--   dtq:conc:{<q>}:active         hash key -> active tasks (field deleted at 0)
--   dtq:conc:{<q>}:waiting        hash key -> parked tasks (field deleted at 0)
--   dtq:conc:{<q>}:parked:<key>   list of parked task ids, oldest first
-- A keyed task is counted in `active` from activation to the end of its lease, with or
-- without a limit, so a limit set later starts from true counts. A task whose key is at
-- its limit is parked: its entry leaves the band stream (acked and deleted), its id goes
-- to the key's parked list, its record stays queued with parked = '1' and entry_id ''.
-- Every lease end frees the slot and moves ONE parked task of that key back to the tail
-- of its band stream. Each function runs inside a script that already fenced the
-- transition (status queued -> active, or a current lease ending), so a re-run of the
-- script changes nothing twice.

local function conc_prefix(queue)
  return 'dtq:conc:{' .. queue .. '}:'
end

local conc_limits = {}  -- queue -> limit (0 = none), read once per script call

-- The queue's per-key limit (0 = none).
local function conc_limit(queue)
  local l = conc_limits[queue]
  if l == nil then
    l = tonumber(redis.call('GET', conc_prefix(queue) .. 'limit')) or 0
    conc_limits[queue] = l
  end
  return l
end

-- Take a slot of key `ckey` for a task about to become active. Returns true when taken
-- (counted), false when the key is at its limit (the caller parks the task). One
-- HINCRBY when a slot is free (the common case), a second one to undo it otherwise.
local function ckey_take(queue, ckey)
  local active = conc_prefix(queue) .. 'active'
  local limit = conc_limit(queue)
  if redis.call('HINCRBY', active, ckey, 1) > limit and limit > 0 then
    redis.call('HINCRBY', active, ckey, -1)
    return false
  end
  return true
end

local conc_parked = {}  -- queue -> whether it had parked tasks, read once per call

-- Whether the queue may have parked tasks (its waiting hash exists): read once per
-- script call and set again by ckey_park, so a lease end of a queue with nothing parked
-- costs no look at a parked list.
local function conc_any_parked(queue)
  local any = conc_parked[queue]
  if any == nil then
    any = redis.call('EXISTS', conc_prefix(queue) .. 'waiting') == 1
    conc_parked[queue] = any
  end
  return any
end

-- Park a queued task whose entry the caller just acked and deleted: id to the tail of
-- the key's parked list; the record keeps `queued_at` (epoch ms it began to wait) for the
-- entry it gets back.
local function ckey_park(queue, ckey, task_key, task_id, queued_at, ms)
  local p = conc_prefix(queue)
  redis.call('RPUSH', p .. 'parked:' .. ckey, task_id)
  redis.call('HINCRBY', p .. 'waiting', ckey, 1)
  conc_parked[queue] = true
  redis.call('HSET', task_key, 'parked', '1', 'entry_id', '', 'queued_at', queued_at,
    'updated_at_ms', ms)
end

local function waiting_less(p, ckey, n)
  if redis.call('HINCRBY', p .. 'waiting', ckey, -n) <= 0 then
    redis.call('HDEL', p .. 'waiting', ckey)
  end
end

-- Move up to `count` parked tasks of `ckey` back to the tail of their band streams
-- (ids whose task is no longer parked are dropped). Returns the number moved.
local function ckey_unpark(queue, ckey, count)
  local p = conc_prefix(queue)
  local list = p .. 'parked:' .. ckey
  local moved = 0
  while moved < count do
    local id = redis.call('LPOP', list)
    if not id then break end
    waiting_less(p, ckey, 1)
    local task_key = finished_task_keys(id)
    local h = redis.call('HMGET', task_key, 'status', 'parked', 'priority', 'attempt',
      'queued_at', 'task_type')
    if h[1] == 'queued' and h[2] == '1' then
      redis.call('HDEL', task_key, 'parked')
      add_entry('dtq:stream:{' .. queue .. '}:p' .. h[3], task_key, h[4], h[5])
      moved = moved + 1
      -- wakes the lease dispatchers of every replica (WAKE_EVENTS)
      publish('TASK_QUEUED', now_ms(), id, queue, h[6], h[4], '',
        {reason = 'unparked', concurrency_key = ckey})
    end
  end
  return moved
end

-- A lease of a task with key `ckey` ended: free its slot and give one parked task of
-- the key its turn. Returns the number of tasks moved back (0 or 1; 0 for a task
-- without a key), so the caller can wake its own dispatcher.
local function ckey_release(queue, ckey)
  if not ckey or ckey == '' then return 0 end
  local active = conc_prefix(queue) .. 'active'
  if redis.call('HINCRBY', active, ckey, -1) <= 0 then redis.call('HDEL', active, ckey) end
  if not conc_any_parked(queue) then return 0 end
  return ckey_unpark(queue, ckey, 1)
end

-- A queued task of key `ckey` that was in its band (not parked) leaves without running
-- (cancelled, expired): when the key has a free slot and parked tasks, one goes back,
-- so parked tasks never wait on a task that will not run. No-op without a key.
local function ckey_refill(queue, ckey)
  if not ckey or ckey == '' then return end
  local p = conc_prefix(queue)
  if not redis.call('HGET', p .. 'waiting', ckey) then return end
  local limit = conc_limit(queue)
  if limit > 0 and (tonumber(redis.call('HGET', p .. 'active', ckey)) or 0) >= limit then
    return
  end
  ckey_unpark(queue, ckey, 1)
end

-- A parked task leaves the queue without running (cancelled, expired): take its id out
-- of the parked list. `parked` is the record's parked field.
local function ckey_unpark_gone(queue, ckey, parked, task_key, task_id)
  if parked ~= '1' or not ckey or ckey == '' then return end
  local p = conc_prefix(queue)
  local n = redis.call('LREM', p .. 'parked:' .. ckey, 1, task_id)
  if n > 0 then waiting_less(p, ckey, n) end
  redis.call('HDEL', task_key, 'parked')
end
