-- lease_read: read new entries for one consumer, strictly p9 -> p0 across the queues of
-- the call, never exceeding the consumer's max_in_flight counted from the PEL. On Redis
-- Cluster every queue of one call is in one hash slot (a session's queues are read slot
-- by slot); on a standalone Redis one call reads all of a session's queues (see
-- store/leasing.py, session_layout). The worker's own state is checked by worker_check.lua.
-- The entries read are activated by activate.lua (the two-step path); lease_take.lua
-- reads and activates in one call. The read itself is read_entries (_lease_read.lua).
-- KEYS[1..m]           pause flags dtq:queue:{<q>}:paused, one per queue
-- KEYS[m+1 .. 2m]      rate limits dtq:queue:{<q>}:ratelimit, one per queue (_bucket.lua)
-- KEYS[2m+1 .. 2m+n]   band streams, band-major: p9 of every queue, then p8, ... (n = 10m,
--                      or m for a read of one band)
-- ARGV[3] group  [4] consumer (worker id)  [5] max_in_flight  [6] max entries this call
--         (0 = read nothing: count pending and report the non-empty streams, as a 6th
--         reply item {stream index, ...})
-- ARGV[7] m (number of queues)  [8] unused
-- Reply: {pending_before, {stream indexes without group}, 0,
--         number of non-empty band streams (0 = every queue of the call is empty),
--         {wait_ms, {typed}, {limited}, {throttled}},
--         {stream index, entry id, {field, value, ...}}, ...}
--         (stream index is 1-based into the streams part; typed, limited and throttled
--         are 1-based queue indexes: queues with task-type limits, queues with any
--         limit, and queues whose queue-wide limit held entries back; wait_ms = ms until
--         the first throttled queue has a token again, 0 = none throttled)
-- A queue-wide rate limit caps the COUNT of each XREADGROUP at the bucket's whole
-- tokens and takes one per entry read: a throttled task is never read, so it stays in
-- its stream, queued, in order, with no attempt spent (docs/rate-limits.md).
local m = tonumber(ARGV[7])
local reply, allow, throttled, _, now = read_entries(ARGV[3], ARGV[4], tonumber(ARGV[5]),
  tonumber(ARGV[6]), m, 2 * m)
store_limits(reply, allow, throttled, now, m)
return reply
