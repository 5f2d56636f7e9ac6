-- _lease_read.lua: the read half of lease_take.lua (prepended by
-- scripts.py after _bucket.lua). Reads new entries for one consumer, strictly p9 -> p0
-- across the queues of the call, never exceeding the consumer's max_in_flight counted
-- from the PEL, honouring pause flags and each queue's queue-wide rate limit.
-- The caller's KEYS hold, for m queues: pause flags at KEYS[q], rate-limit hashes at
-- KEYS[m + q], and the band streams (band-major: p9 of every queue, then p8, ...) from
-- KEYS[S + 1] on (n_streams of them); see lease_take.lua for the reply.

-- The 1-based indexes (ascending) of the streams KEYS[S + 1 ..] that hold entries.
-- XLEN counts queued and pending entries alike (entries are deleted when their lease
-- ends), so an empty stream needs no further call. Only the bands in a queue's trusted
-- summary (bands_key, _lib.lua) are probed, and a band found empty leaves it; a queue
-- without one has all its streams probed and, when the call names its ten bands, the
-- summary rebuilt. At rest most bands are empty: one SMEMBERS per queue.
local function live_streams(S, n_streams, m)
  local sets, found, live = {}, {}, {}
  for q = 1, math.min(m, n_streams) do
    local key = bands_key(KEYS[S + q])
    local set = {}
    for _, b in ipairs(key and redis.call('SMEMBERS', key) or {}) do set[b] = true end
    if set['*'] then sets[q] = set end
    found[q] = {}
  end
  for i = 1, n_streams do
    local q, band = ((i - 1) % m) + 1, string.sub(KEYS[S + i], -1)
    local set = sets[q]
    if not set or set[band] then
      if redis.call('XLEN', KEYS[S + i]) > 0 then
        live[#live + 1] = i
        found[q][#found[q] + 1] = band
      elseif set then
        redis.call('SREM', bands_key(KEYS[S + i]), band)
      end
    end
  end
  if n_streams == 10 * m then
    for q = 1, m do
      local key = bands_key(KEYS[S + q])
      if key and not sets[q] then
        redis.call('DEL', key)
        redis.call('SADD', key, '*', unpack(found[q]))
        redis.call('PEXPIRE', key, BANDS_TTL_MS)
      end
    end
  end
  return live
end

-- One pass over the live streams, p9 -> p0 (in st.live order): XREADGROUP '>' from
-- each stream not paused, missing or drained, COUNT = the credit left (st.credit), at
-- most the queue's whole queue-wide tokens and the scan bound left (st.scan_max -
-- st.scanned). Appends {stream index, entry id, fields} to reply per entry read and
-- counts it in st.scanned, takes credit and tokens for it, and records the last id
-- read per stream (st.last). A stream that returns fewer entries than asked holds
-- nothing more to read for the group in this call (st.skip).
local function read_pass(st, reply)
  local m, S = st.m, st.S
  for _, i in ipairs(st.live) do
    local q = ((i - 1) % m) + 1
    if not st.paused[q] and not st.skip[i] then
      local count, a = math.min(st.credit, st.scan_max - st.scanned), st.allow[q]
      local by_tokens = a and math.floor(a[1]) < count
      if by_tokens then count = math.floor(a[1]) end
      if count <= 0 then
        st.throttled[q] = true
      else
        local r = redis.pcall('XREADGROUP', 'GROUP', st.group, st.consumer, 'COUNT', count,
          'STREAMS', KEYS[S + i], '>')
        local got = 0
        if type(r) == 'table' and r.err then
          reply[2][#reply[2] + 1] = i
          st.skip[i] = true
        elseif r then
          got = #r[1][2]
          for _, e in ipairs(r[1][2]) do
            reply[#reply + 1] = {i, e[1], e[2]}
            st.last[i] = e[1]
          end
          st.credit, st.scanned = st.credit - got, st.scanned + got
          if a then
            a[1] = a[1] - got
            -- tokens ran out while this stream had more: held back until a refill
            if by_tokens and got == count then st.throttled[q] = true end
          end
        end
        if got < count then st.skip[i] = true end
      end
      if st.credit <= 0 or st.scanned >= st.scan_max then break end
    end
  end
end

-- Read entries. Returns reply ({pending, missing, 0, live count, limits, 0 (the worker
-- state: lease_take.lua sets it), entries...}),
-- then the queue-wide buckets read (q -> {tokens, limit, period_ms}), the queues held
-- back by them (q -> true), the queues with task-type limits (q -> true), the Redis
-- TIME read (0 = none) and the read state for more passes (read_pass; nil when nothing
-- was read: a peek, or no credit). A peek (max_count 0) returns reply with the live
-- list as item 7. scan_max: most entries read in all passes of the call (>= 1).
-- n_streams: how many band streams follow KEYS[S] (any keys after them are not
-- streams). now: a Redis TIME the caller read already (epoch ms), or 0.
-- turn: 0-based queue each band is read from first, the others after it in call order,
-- wrapping around (the caller advances it per read, so the queues of one band are
-- served in turn: docs/fairness.md); bands stay strictly p9 -> p0.
local function read_entries(group, consumer, max_in_flight, max_count, m, S, turn, scan_max,
                            n_streams, now)
  local missing, pending = {}, 0
  local live = live_streams(S, n_streams, m)
  for _, i in ipairs(live) do
    -- summary form: O(consumers holding entries), not O(entries held)
    local r = redis.pcall('XPENDING', KEYS[S + i], group)
    if type(r) == 'table' and r.err then
      missing[#missing + 1] = i
    elseif r[4] then
      for _, c in ipairs(r[4]) do
        if c[1] == consumer then pending = pending + tonumber(c[2]) end
      end
    end
  end
  local limits = {0, {}, {}, {}}
  local reply = {pending, missing, 0, #live, limits, 0}
  local allow, throttled, typed = {}, {}, {}
  if max_count == 0 then
    reply[7] = live
    return reply, allow, throttled, typed, now
  end
  local credit = math.min(max_in_flight - pending, max_count)
  if credit <= 0 then return reply, allow, throttled, typed, now end

  -- pause flag and rate limit of each queue with live streams (the others are not
  -- read): one EXISTS of both keys, which answers 0 for most queues
  local paused, limited = {}, {}
  for _, i in ipairs(live) do
    local q = ((i - 1) % m) + 1
    if paused[q] == nil then
      local n = redis.call('EXISTS', KEYS[q], KEYS[m + q])
      paused[q], limited[q] = n == 2, n == 2
      if n == 1 then
        paused[q] = redis.call('EXISTS', KEYS[q]) == 1
        limited[q] = not paused[q]
      end
    end
  end
  local skip = {}
  for _, i in ipairs(missing) do skip[i] = true end
  turn = (turn or 0) % m
  if turn > 0 then
    table.sort(live, function(x, y)
      local bx, by = math.floor((x - 1) / m), math.floor((y - 1) / m)
      if bx ~= by then return bx < by end
      return (x - 1 - turn) % m < (y - 1 - turn) % m
    end)
  end

  -- rate limits of the queues that have live streams
  for q = 1, m do
    if limited[q] and not paused[q] then
      if now == 0 then now = now_ms() end
      limits[3][#limits[3] + 1] = q
      local tok, limit, period = bucket_level(KEYS[m + q], '*', now)
      if tok then allow[q] = {tok, limit, period} end
      if redis.call('HEXISTS', KEYS[m + q], 'types') == 1 then
        limits[2][#limits[2] + 1] = q
        typed[q] = true
      end
    end
  end

  local st = {group = group, consumer = consumer, live = live, paused = paused,
    skip = skip, allow = allow, throttled = throttled, m = m, S = S, credit = credit,
    scanned = 0, scan_max = scan_max, last = {}}
  read_pass(st, reply)
  return reply, allow, throttled, typed, now, st
end

-- Store the queue-wide buckets read_entries took tokens from and report the throttled
-- queues in limits (reply[5]): their 1-based indexes and the ms until the first has a
-- whole token again (a bucket that holds one already, after tokens were given back,
-- counts as 1 ms).
local function store_limits(reply, allow, throttled, now, m)
  local limits = reply[5]
  for q, a in pairs(allow) do
    bucket_store(KEYS[m + q], '*', a[1], now)
    if throttled[q] then
      limits[4][#limits[4] + 1] = q
      local w = 1
      if a[1] < 1 then w = bucket_wait_ms(a[1] - math.floor(a[1]), a[2], a[3]) end
      if limits[1] == 0 or w < limits[1] then limits[1] = w end
    end
  end
end
