-- Helpers prefixed to every script, mirroring broker-core's bucket.rs and
-- state.rs. Times are us in doubles; results not small integers are strings.
--
-- KEYS[1]  bucket hash: n, tokens:i, ts:i, nb:i for bucket i = 1..n; with
--          n = 0 (no rate limit), hold: the end of a penalty (see load)
-- KEYS[2]  lease set: lease id -> expiry
-- KEYS[3]  settle only, when given: its own key (scripts::run_once), kept
--          for ARGV[REST + 5] ms
-- ARGV[1]  now in us, or '' for the server's TIME
-- ARGV[2]  ttl margin in ms added to every PEXPIRE
-- ARGV[3]  n, the number of buckets
-- ARGV[4 + 4(i-1) ..]  capacity, amount, period, c (the per-bucket operand)
-- ARGV[4 + 4n ..]      operands of the transition (see each script)

local min, max, floor, ceil = math.min, math.max, math.floor, math.ceil
local format, call, tonumber = string.format, redis.call, tonumber

-- u64::MAX as an f64: where Rust saturates, Lua clamps to this.
local U64 = 18446744073709551616

-- The number of buckets, and the first operand of the transition.
local N, REST

local function fmt(x)
  return format('%.17g', x)
end

-- u64::saturating_add.
local function sat_add(a, b)
  local x = a + b
  if x > U64 then return U64 end
  return x
end

local function read_now()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  -- Needed before Redis 5 to write after TIME; a no-op since.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Reads N and REST; returns now.
local function args()
  N = tonumber(ARGV[3])
  REST = 4 + 4 * N
  return read_now()
end

-- What state::adopt carries over from a hash made for `n` buckets, not N:
-- the latest nb of its buckets, or its penalty; 0 for none.
local function penalty_end(n)
  local fields = { 'hold' }
  for i = 1, min(n, call('HLEN', KEYS[1]), 4096) do
    fields[i + 1] = 'nb:' .. i
  end
  local v = call('HMGET', KEYS[1], unpack(fields))
  local until_ = 0
  for i = 1, #fields do
    until_ = max(until_, tonumber(v[i]) or 0)
  end
  return until_
end

-- Bucket (bucket.rs): tokens, ts, nb; parameters capacity, amount, period.

-- bucket::refill: returns tokens, ts.
local function refill(tokens, ts, now, capacity, amount, period)
  if now > ts then
    tokens = tokens + (now - ts) * (amount / period)
    ts = now
  end
  -- Capped also with no time passed: the burst may have been lowered.
  if capacity < tokens then tokens = capacity end
  return tokens, ts
end

-- bucket::ceil_micros: up to a whole us, except within a nanosecond of one.
local function ceil_micros(x)
  local whole = floor(x)
  if x - whole >= 1e-3 then whole = whole + 1 end
  return min(whole, U64)
end

-- bucket::wait_for, for a bucket refilled to now.
local function wait_for(tokens, nb, now, cost, amount, period)
  local deficit = cost - tokens
  local rate_wait = 0
  if deficit > 0 then
    rate_wait = ceil_micros(deficit * (period / amount))
  end
  if nb > now and nb - now > rate_wait then
    return nb - now
  end
  return rate_wait
end

-- bucket::book_at: take cost as of now + wait. Returns tokens, ts.
local function book_at(tokens, ts, now, cost, wait, capacity, amount, period)
  if now < ts then now = ts end
  tokens, ts = refill(tokens, ts, now, capacity, amount, period)
  local ahead = wait * (amount / period)
  tokens = tokens + ahead
  if capacity < tokens then tokens = capacity end
  return tokens - cost - ahead, ts
end

-- bucket::unclaimed: of a refund of delta booked for due, what no later
-- booking was granted. For a bucket refilled to now.
local function unclaimed(tokens, nb, now, delta, due, amount, period)
  local debt = 0
  if tokens < 0 then debt = ceil_micros(-tokens * (period / amount)) end
  local last = max(sat_add(now, debt), nb)
  if last <= due then return delta end
  local claimed = (last - due) * (amount / period)
  if claimed < delta then return delta - claimed end
  return 0
end

-- A PEXPIRE for `us` from now: in ms, at most 10^15, plus the margin.
local function pttl(us)
  return min(ceil(us / 1000), 1e15) + tonumber(ARGV[2])
end

-- bucket::ttl as a PEXPIRE; nil when idle.
local function ttl_ms(tokens, ts, nb, now, capacity, amount, period)
  local n = max(now, ts)
  local r = refill(tokens, ts, n, capacity, amount, period)
  if r >= capacity and nb <= now then
    return nil
  end
  return pttl(wait_for(r, nb, n, capacity, amount, period))
end

-- State (state.rs) over N buckets, held in parallel arrays.

local capacity, amount, period, c = {}, {}, {}, {}
local tokens, ts, nb = {}, {}, {}
-- ResourceState::penalty: with no bucket, the end of a penalty (field
-- `hold`); 0 for none.
local penalty = 0

local function names(i)
  return 'tokens:' .. i, 'ts:' .. i, 'nb:' .. i
end

-- Writes the buckets back with the longest TTL among them, or deletes the
-- hash when all are idle; with no bucket, the penalty until it ends.
local function save(now)
  local ms = nil
  local fields = { 'n', N }
  if N == 0 and penalty > now then
    ms = pttl(penalty - now)
    fields[3], fields[4] = 'hold', penalty
  end
  for i = 1, N do
    local t = ttl_ms(tokens[i], ts[i], nb[i], now, capacity[i], amount[i], period[i])
    if t ~= nil and (ms == nil or t > ms) then
      ms = t
    end
    local f = 6 * i - 3
    fields[f], fields[f + 2], fields[f + 4] = names(i)
    fields[f + 1], fields[f + 3], fields[f + 5] = tokens[i], ts[i], nb[i]
  end
  if ms == nil then
    call('DEL', KEYS[1])
    return
  end
  call('HSET', KEYS[1], unpack(fields))
  call('PEXPIRE', KEYS[1], ms)
end

-- Reads the buckets (with none, the penalty); a missing hash is fresh, one of
-- another number of buckets adopted (state::adopt) and written back at once.
local function load(now)
  local fields = { 'n', 'hold' }
  for i = 1, N do
    fields[3 * i], fields[3 * i + 1], fields[3 * i + 2] = names(i)
  end
  local v = call('HMGET', KEYS[1], unpack(fields))
  local n = tonumber(v[1])
  local fresh = n ~= N
  local until_ = 0
  if fresh and n ~= nil then until_ = penalty_end(n) end
  if until_ <= now then until_ = 0 end
  penalty = until_
  if N == 0 and not fresh then penalty = tonumber(v[2]) or 0 end
  for i = 1, N do
    local a = 4 * i
    capacity[i], amount[i], period[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    c[i] = ARGV[a + 3]
    if fresh then
      tokens[i], ts[i], nb[i] = capacity[i], now, until_
    else
      tokens[i], ts[i], nb[i] = tonumber(v[3 * i]), tonumber(v[3 * i + 1]), tonumber(v[3 * i + 2])
    end
  end
  if fresh and n ~= nil then save(now) end
end

-- state::wait_all: the longest wait among buckets with a non-zero cost.
local function wait_all(now)
  if N == 0 then return max(penalty - now, 0) end
  local wait = 0
  for i = 1, N do
    local cost = tonumber(c[i])
    if cost > 0 then
      local n = max(now, ts[i])
      local r = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
      wait = max(wait, wait_for(r, nb[i], n, cost, amount[i], period[i]))
    end
  end
  return wait
end

-- state::book_all: book cost in every bucket with a non-zero cost.
local function book_all(now, wait)
  for i = 1, N do
    local cost = tonumber(c[i])
    if cost > 0 then
      tokens[i], ts[i] = book_at(tokens[i], ts[i], now, cost, wait, capacity[i], amount[i], period[i])
    end
  end
end

-- Keeps the lease set as long as its latest lease, plus the margin.
local function keep_lease_set(now)
  local last = call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  call('PEXPIRE', KEYS[2], pttl(max(tonumber(last[2]) - now, 0)))
end

-- state::take_slot; max_concurrent '' for no limit.
local function take_slot(now, max_concurrent, lease_ttl, lease)
  if max_concurrent == '' then
    return true
  end
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if call('ZCARD', KEYS[2]) >= tonumber(max_concurrent) then
    return false
  end
  call('ZADD', KEYS[2], sat_add(now, lease_ttl), lease)
  keep_lease_set(now)
  return true
end

-- Whether `lease` is held and live. A decision's lease id is new, so it is
-- held only if this decision ran before (sent again after a lost reply):
-- a second run that would deny answers as the first did.
local function held(now, lease)
  local expiry = call('ZSCORE', KEYS[2], lease)
  return expiry and tonumber(expiry) > now
end
