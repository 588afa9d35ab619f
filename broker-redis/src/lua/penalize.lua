-- penalize (state::penalize, bucket::penalize): drain every bucket to zero
-- (keeping booked debt) and penalize it until now + the penalty; never
-- shortens nb. With no bucket (a concurrency limit alone), the state-wide
-- penalty ends at now + the penalty instead, never shortened either.
-- ARGV[REST] the penalty in us.
args()
local now = read_now()
load(now)
local until_ = sat_add(now, tonumber(ARGV[REST]))
if N == 0 and penalty < until_ then
  penalty = until_
end
for i = 1, N do
  local n = max(now, ts[i])
  -- bucket::on_bucket_time: until, on this caller's clock, moved forward
  -- by as much as now is clamped to ts (n - now).
  local until_i = sat_add(until_, n - now)
  tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
  tokens[i] = min(tokens[i], 0)
  nb[i] = max(nb[i], until_i)
end
save(now)
return 1
