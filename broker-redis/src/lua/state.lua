-- The multi-limit helpers of broker-core's state.rs (wait_all, book_all)
-- over n buckets, and reading and writing the bucket hash. Bucket i's
-- parameters, operand and state are held in parallel arrays.

local capacity, amount, period, c = {}, {}, {}, {}
local tokens, ts, nb = {}, {}, {}
-- ResourceState::hold: with no bucket (N = 0, a concurrency limit alone),
-- the end of a penalty, field `hold` of the hash (with n = 0); 0 for none,
-- and for a hash without the field. Neither read nor written when N > 0.
local hold = 0

-- The field names of bucket i.
local function names(i)
  if i == 1 then return 'tokens:1', 'ts:1', 'nb:1' end
  if i == 2 then return 'tokens:2', 'ts:2', 'nb:2' end
  return 'tokens:' .. i, 'ts:' .. i, 'nb:' .. i
end

-- Reads the buckets (with none, the hold); a missing hash is
-- ResourceState::fresh (full buckets as of now, no hold), and one made for
-- another number of buckets is that, under the penalty it holds
-- (state::adopt: its held_until, put on as state::hold_until does: full
-- buckets held, so that what is adopted does not depend on when). A
-- hash of another number of buckets is written back at once as taken on
-- (or deleted, when that is idle): the reference keeps the adopted state
-- whatever the call decides, so a call that writes nothing after (a
-- denial, a reservation not booked) leaves the same state behind.
local save
local function load(now)
  if N == 0 then
    local v = call('HMGET', KEYS[1], 'n', 'hold')
    local n = tonumber(v[1])
    hold = 0
    if n == 0 then
      hold = tonumber(v[2]) or 0
    elseif n ~= nil then
      local until_ = held_until(n)
      if until_ > now then hold = until_ end
      save(now)
    end
    return
  end
  local fields = { 'n' }
  for i = 1, N do
    local f = 3 * i - 1
    local tokens_i, ts_i, nb_i = names(i)
    fields[f] = tokens_i
    fields[f + 1] = ts_i
    fields[f + 2] = nb_i
  end
  local v = call('HMGET', KEYS[1], unpack(fields))
  local n = tonumber(v[1])
  local fresh = n ~= N
  local until_ = 0
  if fresh and n ~= nil then until_ = held_until(n) end
  for i = 1, N do
    local a = 4 * i
    capacity[i], amount[i], period[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    c[i] = ARGV[a + 3]
    if fresh then
      -- A fresh bucket; under a penalty (until_ > now), held until its
      -- end (state::hold_until on a fresh bucket: ts is now).
      tokens[i], ts[i], nb[i] = capacity[i], now, 0
      if until_ > now then
        nb[i] = until_
      end
    else
      tokens[i], ts[i], nb[i] = tonumber(v[3 * i - 1]), tonumber(v[3 * i]), tonumber(v[3 * i + 1])
    end
  end
  if fresh and n ~= nil then save(now) end
end

-- Writes the buckets back with the longest TTL among them, or deletes the
-- hash when every bucket is idle. With no bucket, writes the hold until
-- it ends (state::ttl: its time left, plus the margin), or deletes the
-- hash once it has ended.
function save(now)
  if N == 0 then
    if hold <= now then
      call('DEL', KEYS[1])
      return
    end
    call('HSET', KEYS[1], 'n', 0, 'hold', hold)
    call('PEXPIRE', KEYS[1], min(ceil((hold - now) / 1000), 1e15) + tonumber(ARGV[2]))
    return
  end
  local ms = nil
  local fields = { 'n', N }
  for i = 1, N do
    local t = ttl_ms(tokens[i], ts[i], nb[i], now, capacity[i], amount[i], period[i])
    if t ~= nil and (ms == nil or t > ms) then
      ms = t
    end
    local f = 6 * i - 3
    local tokens_i, ts_i, nb_i = names(i)
    fields[f] = tokens_i
    fields[f + 1] = tokens[i]
    fields[f + 2] = ts_i
    fields[f + 3] = ts[i]
    fields[f + 4] = nb_i
    fields[f + 5] = nb[i]
  end
  if ms == nil then
    call('DEL', KEYS[1])
    return
  end
  call('HSET', KEYS[1], unpack(fields))
  call('PEXPIRE', KEYS[1], ms)
end

-- state::wait_all: the longest wait among buckets with a non-zero cost;
-- with no bucket, the time left of the hold.
local function wait_all(now)
  if N == 0 then
    if hold > now then return hold - now end
    return 0
  end
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
      tokens[i], ts[i] = book(tokens[i], ts[i], now, cost, wait, capacity[i], amount[i], period[i])
    end
  end
end
