-- penalize (state::penalize): drain every bucket to zero (keeping debt) and
-- penalize it until now + ARGV[REST] us; with no bucket, the state-wide
-- penalty. Never shortens one.
local now = args()
load(now)
local until_ = sat_add(now, tonumber(ARGV[REST]))
if N == 0 and penalty < until_ then
  penalty = until_
end
for i = 1, N do
  local n = max(now, ts[i])
  -- bucket::on_bucket_time.
  local until_i = sat_add(until_, n - now)
  tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
  tokens[i] = min(tokens[i], 0)
  nb[i] = max(nb[i], until_i)
end
save(now)
return 1
