-- One bucket (n = 1) read and written without tables: the fast path for
-- resources with a single rate limit. Same hash layout as state.lua.

-- The bucket's parameters, set from ARGV by one_args.lua once per call.
local capacity, amount, period

-- Writes the bucket back with its TTL, or deletes the hash when it is idle.
local function save(tokens, ts, nb, now)
  local ms = ttl_ms(tokens, ts, nb, now, capacity, amount, period)
  if ms == nil then
    call('DEL', KEYS[1])
    return
  end
  call('HSET', KEYS[1], 'n', 1, 'tokens:1', tokens, 'ts:1', ts, 'nb:1', nb)
  call('PEXPIRE', KEYS[1], ms)
end

-- Reads the bucket as tokens, ts, nb; a missing hash is
-- BucketState::fresh (full as of now), and one made for another number of
-- buckets is that, held until the penalty it holds ends (state::adopt),
-- written back at once as taken on (see state.lua's load).
local function load(now)
  local v = call('HMGET', KEYS[1], 'n', 'tokens:1', 'ts:1', 'nb:1')
  local n = tonumber(v[1])
  if n == nil then
    return capacity, now, 0
  elseif n ~= 1 then
    local until_ = held_until(n)
    if until_ <= now then until_ = 0 end
    save(capacity, now, until_, now)
    return capacity, now, until_
  end
  return tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
end
