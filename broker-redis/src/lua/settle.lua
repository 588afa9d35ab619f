-- settle (state::settle, bucket::settle): c is delta = reserved - actual;
-- a positive delta refunds (capped at capacity), a negative one charges.
local now = read_now()
local params, states, deltas = load(now)
for i = 1, N do
  local delta = tonumber(deltas[i])
  if delta ~= 0 then
    local s = states[i]
    local n = max(now, s.ts)
    s = refill(s, params[i], n)
    s.tokens = min(s.tokens + delta, params[i].capacity)
    states[i] = s
  end
end
save(params, states, now)
return 1
