-- try for one bucket and no concurrency limit: bucket::try_take, the
-- one-limit path of state::try_acquire. ARGV[7] (c) is the cost; no
-- operands after the bucket. Returns {allowed, wait, reason} as try does.
local now = read_now()
local tokens, ts, nb = load(now)
local cost = tonumber(ARGV[7])
if cost > 0 then
  local n = now
  if n < ts then n = ts end
  tokens, ts = refill(tokens, ts, n, capacity, amount, period)
  local wait = wait_for(tokens, nb, n, cost, amount, period)
  if wait > 0 then
    return { 0, fmt(wait), 1 }
  end
  tokens, ts = book(tokens, ts, n, cost, 0, capacity, amount, period)
end
save(tokens, ts, nb, now)
return { 1, '0', 0 }
