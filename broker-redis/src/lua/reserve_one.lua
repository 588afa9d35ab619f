-- reserve for one bucket: bucket::reserve (state::reserve with one limit).
-- ARGV[7] (c) is the cost, ARGV[8] max_wait. Replies as reserve does.
local now = read_now()
local tokens, ts, nb = load(now)
local cost = tonumber(ARGV[7])
local wait = 0
local since = now
if cost > 0 then
  if nb > now then since = nb end
  local n = now
  if n < ts then n = ts end
  tokens, ts = refill(tokens, ts, n, capacity, amount, period)
  wait = wait_for(tokens, nb, n, cost, amount, period)
  if wait > tonumber(ARGV[8]) then
    return { 0, fmt(wait), fmt(now), fmt(since), fmt(now), fmt(now), fmt(now) }
  end
  tokens, ts = book(tokens, ts, n, cost, wait, capacity, amount, period)
end
save(tokens, ts, nb, now)
if wait == 0 and since == now then
  return fmt(now)
end
return { 1, fmt(wait), fmt(now), fmt(since), fmt(now), fmt(now), fmt(now) }
