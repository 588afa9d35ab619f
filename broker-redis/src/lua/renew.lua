-- renew (state::renew): extend a live lease to now + lease_ttl, and the
-- set's expiry with it. An expired lease is not brought back.
-- ARGV[REST] lease_ttl, ARGV[REST+1] lease id. Returns 1 if it was live.
local now = args()
local lease = ARGV[REST + 1]
if not held(now, lease) then
  return 0
end
call('ZADD', KEYS[2], 'XX', sat_add(now, tonumber(ARGV[REST])), lease)
keep_lease_set(now)
return 1
