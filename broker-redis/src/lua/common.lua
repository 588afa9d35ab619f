-- resource-broker: shared part of every script. A line-by-line mirror of
-- broker-core's bucket.rs (refill, ceil_micros, wait_for, book; ttl and
-- is_idle inside save) and of the multi-limit helpers of state.rs (wait_all,
-- book_all, hold_slot). Same names: tokens, ts, nb. Times are microseconds
-- held in doubles (exact below 2^53 us, about 285 years). Numbers are stored with %.17g so they read back
-- bit for bit; results that are not small integers are returned as strings.
--
-- KEYS[1]  bucket hash: n, tokens:i, ts:i, nb:i for bucket i = 1..n
-- KEYS[2]  lease set: lease id -> expiry
-- ARGV[1]  now in us, or '' for the server's TIME
-- ARGV[2]  ttl margin in ms added to every PEXPIRE
-- ARGV[3]  n, the number of buckets
-- ARGV[4 + 4(i-1) ..]  capacity, amount, period, c (the per-bucket operand)
-- ARGV[4 + 4n ..]      operands of the transition (see each script)

local min, max, floor, ceil, abs = math.min, math.max, math.floor, math.ceil, math.abs
local format, call, tonumber = string.format, redis.call, tonumber

-- u64::MAX as an f64: where Rust saturates, Lua clamps to this.
local U64 = 18446744073709551616

local function fmt(x)
  return format('%.17g', x)
end

-- `as Micros` on an f64: saturating.
local function sat(x)
  if x > U64 then return U64 end
  if x < 0 then return 0 end
  return x
end

-- u64::saturating_sub / saturating_add.
local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

local function sat_add(a, b)
  return sat(a + b)
end

local function read_now()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  -- Redis before 5 replicates scripts verbatim unless told otherwise, and
  -- refuses writes after TIME; since Redis 5 this is the default (a no-op).
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local N = tonumber(ARGV[3])
local REST = 4 + 4 * N

-- bucket::refill
local function refill(s, p, now)
  if now <= s.ts then
    return s
  end
  local gained = (now - s.ts) * p.amount / p.period
  return { tokens = min(s.tokens + gained, p.capacity), ts = now, nb = s.nb }
end

-- f64::round (half away from zero), for x >= 0.
local function round(x)
  local f = floor(x)
  if x - f >= 0.5 then
    return f + 1
  end
  return f
end

-- bucket::ceil_micros: up to a whole us, except within a nanosecond of one.
local function ceil_micros(x)
  local nearest = round(x)
  if abs(x - nearest) < 1e-3 then
    return sat(nearest)
  end
  return sat(ceil(x))
end

-- bucket::wait_for
local function wait_for(s, p, now, cost)
  local deficit = cost - s.tokens
  local rate_wait = 0
  if deficit > 0 then
    rate_wait = ceil_micros(deficit * p.period / p.amount)
  end
  return max(rate_wait, sat_sub(s.nb, now))
end

-- Reads the buckets; a missing hash, or one made for another number of
-- buckets, is ResourceState::fresh (full buckets as of now).
local function load(now)
  local fields = { 'n' }
  for i = 1, N do
    fields[#fields + 1] = 'tokens:' .. i
    fields[#fields + 1] = 'ts:' .. i
    fields[#fields + 1] = 'nb:' .. i
  end
  local v = call('HMGET', KEYS[1], unpack(fields))
  local fresh = tonumber(v[1]) ~= N
  local params, states, c = {}, {}, {}
  for i = 1, N do
    local a = 4 + 4 * (i - 1)
    local p = { capacity = tonumber(ARGV[a]), amount = tonumber(ARGV[a + 1]), period = tonumber(ARGV[a + 2]) }
    params[i] = p
    c[i] = ARGV[a + 3]
    if fresh then
      states[i] = { tokens = p.capacity, ts = now, nb = 0 }
    else
      local f = 2 + 3 * (i - 1)
      states[i] = { tokens = tonumber(v[f]), ts = tonumber(v[f + 1]), nb = tonumber(v[f + 2]) }
    end
  end
  return params, states, c
end

-- Writes the buckets back with a TTL from bucket::ttl (so a penalty's nb is
-- kept), or deletes the hash when every bucket is idle (bucket::is_idle: it
-- equals a fresh one). Both read the bucket refilled to max(now, ts).
local function save(params, states, now)
  local idle = true
  local keep = 0
  local fields = { 'n', N }
  for i = 1, N do
    local s, p = states[i], params[i]
    local n = max(now, s.ts)
    local r = refill(s, p, n)
    if not (r.tokens >= p.capacity and r.nb <= now) then
      idle = false
    end
    keep = max(keep, wait_for(r, p, n, p.capacity), sat_sub(r.nb, n))
    fields[#fields + 1] = 'tokens:' .. i
    fields[#fields + 1] = fmt(s.tokens)
    fields[#fields + 1] = 'ts:' .. i
    fields[#fields + 1] = fmt(s.ts)
    fields[#fields + 1] = 'nb:' .. i
    fields[#fields + 1] = fmt(s.nb)
  end
  if idle then
    call('DEL', KEYS[1])
    return
  end
  call('HSET', KEYS[1], unpack(fields))
  call('PEXPIRE', KEYS[1], format('%.0f', min(ceil(keep / 1000), 1e15) + tonumber(ARGV[2])))
end

-- state::wait_all: the longest wait among buckets with a non-zero cost.
local function wait_all(params, states, costs, now)
  local wait = 0
  for i = 1, N do
    local c = tonumber(costs[i])
    if c > 0 then
      local s = states[i]
      local n = max(now, s.ts)
      wait = max(wait, wait_for(refill(s, params[i], n), params[i], n, c))
    end
  end
  return wait
end

-- bucket::book: take cost as of the send time, wait after now.
local function book(s, p, now, cost, wait)
  now = max(now, s.ts)
  s = refill(s, p, now)
  local ahead = wait * p.amount / p.period
  s.tokens = min(s.tokens + ahead, p.capacity) - cost - ahead
  return s
end

-- state::book_all: book cost in every bucket with a non-zero cost.
local function book_all(params, states, costs, now, wait)
  for i = 1, N do
    local c = tonumber(costs[i])
    if c > 0 then
      states[i] = book(states[i], params[i], now, c, wait)
    end
  end
end

-- state::hold_slot over the lease set; max_concurrent == '' means no
-- concurrency limit.
local function hold_slot(now, max_concurrent, lease_ttl, lease)
  if max_concurrent == '' then
    return true
  end
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
  if call('ZCARD', KEYS[2]) >= tonumber(max_concurrent) then
    return false
  end
  call('ZADD', KEYS[2], fmt(sat_add(now, lease_ttl)), lease)
  local last = call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local ms = min(ceil(sat_sub(tonumber(last[2]), now) / 1000), 1e15) + tonumber(ARGV[2])
  call('PEXPIRE', KEYS[2], format('%.0f', ms))
  return true
end
