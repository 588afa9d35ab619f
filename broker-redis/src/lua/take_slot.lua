-- take_slot (state::take_slot): take a concurrency slot under a lease.
-- ARGV[REST] max_concurrent, ARGV[REST+1] lease_ttl, ARGV[REST+2] lease id.
-- Returns 1 when held.
local now = args()
local lease = ARGV[REST + 2]
if take_slot(now, ARGV[REST], tonumber(ARGV[REST + 1]), lease) or held(now, lease) then
  return 1
end
return 0
