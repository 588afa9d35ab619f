-- penalize (state::penalize, bucket::penalize): drain every bucket to zero
-- (keeping booked debt) and hold it until now + hold; never shortens nb.
-- ARGV[REST] hold in us.
local now = read_now()
local params, states = load(now)
local until_ = sat_add(now, tonumber(ARGV[REST]))
for i = 1, N do
  local s = states[i]
  local n = max(now, s.ts)
  s = refill(s, params[i], n)
  s.tokens = min(s.tokens, 0)
  s.nb = max(s.nb, until_)
  states[i] = s
end
save(params, states, now)
return 1
