-- try for one bucket: bucket::try_take, as the one-limit path of
-- state::try_acquire does it, then a slot. ARGV[7] (c) is the cost;
-- ARGV[8] max_concurrent, ARGV[9] lease_ttl, ARGV[10] lease id, all three
-- absent when there is no concurrency limit. Replies as try does.
local now = read_now()
local tokens, ts, nb = load(now)
local cost = tonumber(ARGV[7])
if cost > 0 then
  local n = now
  if n < ts then n = ts end
  tokens, ts = refill(tokens, ts, n, capacity, amount, period)
  local wait = wait_for(tokens, nb, n, cost, amount, period)
  if wait > 0 then
    if ARGV[8] ~= nil and held(now, ARGV[10]) then return 1 end
    return { 1, fmt(wait) }
  end
  tokens, ts = book(tokens, ts, n, cost, 0, capacity, amount, period)
end
if ARGV[8] ~= nil and not hold_slot(now, ARGV[8], tonumber(ARGV[9]), ARGV[10]) then
  if held(now, ARGV[10]) then return 1 end
  return { 2, '0' }
end
save(tokens, ts, nb, now)
return 1
