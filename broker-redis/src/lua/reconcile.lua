-- reconcile (state::reconcile, bucket::reconcile): narrow each bucket to the
-- upstream's remaining, never widen. c is remaining ('' when not observed);
-- ARGV[REST + i - 1] is that bucket's reset in us ('' when not given).
local now = args()
load(now)
for i = 1, N do
  local remaining = tonumber(c[i])
  if remaining ~= nil and remaining < capacity[i] then
    local n = max(now, ts[i])
    local reset = tonumber(ARGV[REST + i - 1])
    local reset_at = nil
    if reset ~= nil then
      -- bucket::on_bucket_time.
      reset_at = sat_add(sat_add(now, reset), n - now)
    end
    tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
    tokens[i] = min(tokens[i], remaining)
    if remaining <= 0 and reset_at ~= nil then
      nb[i] = max(nb[i], reset_at)
    end
  end
end
save(now)
return 1
