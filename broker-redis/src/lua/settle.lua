-- settle (state::settle, bucket::settle): c is delta = reserved - actual;
-- a positive delta refunds (capped at capacity), a negative one charges.
local now = read_now()
load(now)
for i = 1, N do
  local delta = tonumber(c[i])
  if delta ~= 0 then
    local n = max(now, ts[i])
    tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
    tokens[i] = min(tokens[i] + delta, capacity[i])
  end
end
save(now)
return 1
