-- heartbeat: extend one lease (fenced): XCLAIM to its owner with IDLE 0 JUSTID.
-- KEYS[1] band stream  [2] task hash
-- ARGV[3] group  [4] entry id  [5] attempt  [6] worker id  [7] lease grace ms
-- ARGV[8] lease tag (see current_lease)
-- ARGV[9] progress percent 0..100 ('' = no progress report)  [10] progress message
--   (at most 256 bytes): stored on the task record (progress, progress_message,
--   progress_at_ms) and published as TASK_PROGRESS, only when the lease is current
-- ARGV[11] task id (for the event)
-- Reply: 'ok' | 'cancelled' (still extended, so the handler can stop and report) |
--        'lost' (not the current lease, or the reaper already claimed the entry) |
--        'overdue' (past started + timeout + grace: no longer extended, the reaper
--        will reclaim it)
local stream, task_key = KEYS[1], KEYS[2]
local group, id, attempt, worker = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local h = current_lease(task_key, id, worker, attempt, ARGV[8],
  {'started_at_ms', 'timeout_ms', 'cancel_requested', 'task_type'})
-- the PEL must still name this worker: XCLAIM below would otherwise take the entry
-- back from the reaper, which claimed it because the lease expired
if not h or not owns(stream, group, id, worker) then return 'lost' end
local now = now_ms()
if now > tonumber(h[8]) + tonumber(h[9]) + tonumber(ARGV[7]) then return 'overdue' end
redis.call('XCLAIM', stream, group, worker, 0, id, 'IDLE', 0, 'JUSTID')
if ARGV[9] ~= '' then
  redis.call('HSET', task_key, 'progress', ARGV[9], 'progress_message', ARGV[10],
    'progress_at_ms', now)
  publish('TASK_PROGRESS', now, ARGV[11], h[5], h[11], attempt, worker, {percent = tonumber(ARGV[9]), message = ARGV[10]})
end
if h[10] == '1' then return 'cancelled' end
return 'ok'
