-- reconcile (state::reconcile, bucket::reconcile): narrow each bucket to the
-- upstream's remaining, never widen. c is remaining ('' when not observed);
-- ARGV[REST + i - 1] is that bucket's reset in us ('' when not given).
local now = read_now()
local params, states, remainings = load(now)
for i = 1, N do
  local remaining = tonumber(remainings[i])
  if remaining ~= nil and remaining < params[i].capacity then
    local reset = tonumber(ARGV[REST + i - 1])
    local reset_at = nil
    if reset ~= nil then
      reset_at = sat_add(now, reset)
    end
    local s = states[i]
    local n = max(now, s.ts)
    s = refill(s, params[i], n)
    s.tokens = min(s.tokens, remaining)
    if remaining <= 0 and reset_at ~= nil then
      s.nb = max(s.nb, reset_at)
    end
    states[i] = s
  end
end
save(params, states, now)
return 1
