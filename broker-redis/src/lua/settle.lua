-- settle (state::settle, bucket::settle): c is delta = reserved - actual;
-- a positive delta refunds (capped at capacity), a negative one charges.
-- No refund while the bucket is held (nb after now): the hold's drain took
-- the unused tokens.
local now = read_now()
load(now)
for i = 1, N do
  local delta = tonumber(c[i])
  if delta ~= 0 then
    local n = max(now, ts[i])
    tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
    if delta < 0 or nb[i] <= n then
      tokens[i] = min(tokens[i] + delta, capacity[i])
    end
  end
end
save(now)
return 1
