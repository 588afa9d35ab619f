-- resource-broker: the part every script starts with.
-- Times are microseconds held in doubles (exact below 2^53 us, about 285
-- years). Stored numbers are passed to HSET as Lua numbers, which Redis
-- writes with 17 significant digits (or the shortest exact form), so they
-- read back bit for bit; results that are not small integers are returned
-- as strings.
--
-- KEYS[1]  bucket hash: n, tokens:i, ts:i, nb:i for bucket i = 1..n; with
--          n = 0 (no rate limit), hold: the end of a penalty (state.lua)
-- KEYS[2]  lease set: lease id -> expiry
-- KEYS[3]  settle only, when given: its own key (scripts::run_once), kept
--          for ARGV[REST + 5] ms
-- ARGV[1]  now in us, or '' for the server's TIME
-- ARGV[2]  ttl margin in ms added to every PEXPIRE
-- ARGV[3]  n, the number of buckets
-- ARGV[4 + 4(i-1) ..]  capacity, amount, period, c (the per-bucket operand)
-- ARGV[4 + 4n ..]      operands of the transition (see each script)

local min, max, floor, ceil, abs = math.min, math.max, math.floor, math.ceil, math.abs
local format, call, tonumber = string.format, redis.call, tonumber

-- u64::MAX as an f64: where Rust saturates, Lua clamps to this.
local U64 = 18446744073709551616

-- N, the number of buckets, and REST, the first operand of the transition;
-- set from ARGV by args.lua, once per call, before the transition's body.
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
  -- Redis before 5 replicates scripts verbatim unless told otherwise, and
  -- refuses writes after TIME; since Redis 5 this is the default (a no-op).
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- state::held_until of the hash KEYS[1] made for another number of
-- buckets than N (its field n says `n`): the latest nb of its buckets, or
-- its hold; 0 for none. What state::adopt carries over to the new
-- buckets (a reload to another number of rate limits). The buckets read
-- are bounded by the hash's own size, whatever n says.
local function held_until(n)
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
