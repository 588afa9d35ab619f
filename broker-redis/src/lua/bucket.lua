-- A line-by-line mirror of broker-core's bucket.rs on plain values: a
-- bucket is tokens, ts, nb (same names), its parameters capacity, amount,
-- period. No tables, and no call out of Lua on the common path:
-- `if b < a then a = b end` is f64::min as math.min computes it, and
-- `if a < b then a = b end` is max.

-- bucket::refill: returns tokens, ts.
local function refill(tokens, ts, now, capacity, amount, period)
  if now > ts then
    tokens = tokens + (now - ts) * (amount / period)
    ts = now
  end
  -- Capped also with no time passed: a burst lowered since (a
  -- re-registration) holds no more than the new burst.
  if capacity < tokens then tokens = capacity end
  return tokens, ts
end

-- bucket::ceil_micros: up to a whole us, except within a nanosecond of one
-- (nearest is f64::round, half away from zero, for x >= 0); saturating.
local function ceil_micros(x)
  local nearest = floor(x)
  if x - nearest >= 0.5 then nearest = nearest + 1 end
  local r = ceil(x)
  if abs(x - nearest) < 1e-3 then r = nearest end
  if r > U64 then return U64 end
  return r
end

-- bucket::wait_for, for a bucket refilled to now: the rate wait, or until
-- nb (nb.saturating_sub(now)) if that is longer.
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

-- bucket::book: take cost as of the send time, wait after now. Returns
-- tokens, ts.
local function book(tokens, ts, now, cost, wait, capacity, amount, period)
  if now < ts then now = ts end
  tokens, ts = refill(tokens, ts, now, capacity, amount, period)
  local ahead = wait * (amount / period)
  tokens = tokens + ahead
  if capacity < tokens then tokens = capacity end
  return tokens - cost - ahead, ts
end

-- bucket::unclaimed: of a refund of delta booked for due, what no later
-- booking was granted: delta less the refill from due to the last booking
-- (when the debt is refilled, or nb if later), 0 at least. For a bucket
-- refilled to now.
local function unclaimed(tokens, nb, now, delta, due, amount, period)
  local debt = 0
  if tokens < 0 then debt = ceil_micros(-tokens * (period / amount)) end
  local last = sat_add(now, debt)
  if last < nb then last = nb end
  if last <= due then return delta end
  local claimed = (last - due) * (amount / period)
  if claimed < delta then return delta - claimed end
  return 0
end

-- bucket::ttl in whole ms (PEXPIRE's unit, at most 10^15) plus the margin;
-- nil when the bucket is idle (bucket::is_idle: it equals a fresh one, so
-- it is dropped). wait_for to capacity already covers nb.
local function ttl_ms(tokens, ts, nb, now, capacity, amount, period)
  local n = now
  if n < ts then n = ts end
  local r = refill(tokens, ts, n, capacity, amount, period)
  if r >= capacity and nb <= now then
    return nil
  end
  local ms = ceil(wait_for(r, nb, n, capacity, amount, period) / 1000)
  if ms > 1e15 then ms = 1e15 end
  return ms + tonumber(ARGV[2])
end
