-- try for one bucket and no concurrency limit (the most common resource),
-- as one flat chunk: try_one.lua with the helpers it calls from
-- common.lua, bucket.lua and one.lua written out in place, step by step
-- and operation by operation, so that a call creates one closure instead
-- of a dozen. Same KEYS, ARGV, hash layout and replies as try_one.lua; the
-- conformance property test holds it to broker-core's reference bit for
-- bit. The comments name the mirrored functions.
--
-- What a call costs the server is kept down without changing a result:
-- strings become numbers by arithmetic (`s + 0`, one parse; `tonumber`
-- parses twice), an existing hash gets back only the fields a try changes
-- (tokens and ts: `n` and `nb` stay as they were stored), and whole
-- numbers go to Redis as integer strings (`%d`; Redis would print a Lua
-- number with `%.17g`, the same digits at a higher cost).
local tonumber, call, format = tonumber, redis.call, string.format
local floor, ceil, abs = math.floor, math.ceil, math.abs
local U64 = 18446744073709551616
local capacity, amount, period = ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0
-- BucketParams::tokens_per_micro and micros_per_token: the quotients the
-- transitions multiply by.
local tokens_per_micro, micros_per_token = amount / period, period / amount

-- bucket::wait_for for a bucket refilled to n: the rate wait for want
-- tokens (bucket::ceil_micros written out), or until nb if that is longer.
local function wait_for(tokens, nb, n, want)
  local deficit = want - tokens
  local wait = 0
  if deficit > 0 then
    local x = deficit * micros_per_token
    local nearest = floor(x)
    if x - nearest >= 0.5 then nearest = nearest + 1 end
    wait = ceil(x)
    if abs(x - nearest) < 1e-3 then wait = nearest end
    if wait > U64 then wait = U64 end
  end
  if nb > n and nb - n > wait then
    return nb - n
  end
  return wait
end

-- read_now
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end

-- load; stored: the hash holds this bucket (n = 1), so that save writes
-- back only tokens and ts.
local tokens, ts, nb
local v = call('HMGET', KEYS[1], 'n', 'tokens:1', 'ts:1', 'nb:1')
local stored = v[1] == '1' or tonumber(v[1]) == 1
if not stored then
  tokens, ts, nb = capacity, now, 0
  local n = tonumber(v[1])
  if n ~= nil then
    -- A hash made for another number of buckets: state::adopt, its
    -- penalty (held_until: the latest nb of its buckets, or its hold)
    -- holds the fresh bucket (state::hold_until), which stays full.
    local fields = { 'hold' }
    for i = 1, math.min(n, call('HLEN', KEYS[1]), 4096) do
      fields[i + 1] = 'nb:' .. i
    end
    local held = call('HMGET', KEYS[1], unpack(fields))
    local until_ = 0
    for i = 1, #fields do
      local x = tonumber(held[i]) or 0
      if x > until_ then until_ = x end
    end
    if until_ > now then
      nb = until_
    end
    -- Written back at once as taken on (see state.lua's load): full, so
    -- idle (deleted) unless held, and then kept until the hold ends.
    if nb > now then
      local ms = ceil((nb - now) / 1000)
      if ms > 1e15 then ms = 1e15 end
      call('HSET', KEYS[1], 'n', 1, 'tokens:1', tokens, 'ts:1', ts, 'nb:1', nb)
      call('PEXPIRE', KEYS[1], format('%d', ms + ARGV[2]))
    else
      call('DEL', KEYS[1])
    end
  end
else
  tokens, ts, nb = v[2] + 0, v[3] + 0, v[4] + 0
end

local cost = ARGV[7] + 0
if cost > 0 then
  local n = now
  if n < ts then n = ts end
  -- refill(tokens, ts, n): capped also with no time passed.
  if n > ts then
    tokens = tokens + (n - ts) * tokens_per_micro
    ts = n
  end
  if capacity < tokens then tokens = capacity end
  local wait = wait_for(tokens, nb, n, cost)
  if wait > 0 then
    return { 1, string.format('%.17g', wait) }
  end
  -- book(tokens, ts, n, cost, 0): the refill to n is done (ts >= n).
  local ahead = 0 * tokens_per_micro
  tokens = tokens + ahead
  if capacity < tokens then tokens = capacity end
  tokens = tokens - cost - ahead
end

-- save(tokens, ts, nb, now), with ttl_ms
local n = now
if n < ts then n = ts end
local r = tokens
if n > ts then
  r = tokens + (n - ts) * tokens_per_micro
end
if capacity < r then r = capacity end
if r >= capacity and nb <= now then
  call('DEL', KEYS[1])
  return 1
end
local ms = ceil(wait_for(r, nb, n, capacity) / 1000)
if ms > 1e15 then ms = 1e15 end
if not stored then
  call('HSET', KEYS[1], 'n', 1, 'tokens:1', tokens, 'ts:1', ts, 'nb:1', nb)
elseif ts == floor(ts) and abs(ts) < 9007199254740992 then
  call('HSET', KEYS[1], 'tokens:1', tokens, 'ts:1', format('%d', ts))
else
  call('HSET', KEYS[1], 'tokens:1', tokens, 'ts:1', ts)
end
call('PEXPIRE', KEYS[1], format('%d', ms + ARGV[2]))
return 1
