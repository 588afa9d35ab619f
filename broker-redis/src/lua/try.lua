-- try (state::try_acquire): take c from every bucket and a slot, or nothing.
-- ARGV[REST] max_concurrent ('' for none), ARGV[REST+1] lease_ttl,
-- ARGV[REST+2] lease id. Returns 1 when allowed; when denied, {reason,
-- wait}: reason 1 rate, 2 concurrency.
args()
local now = read_now()
load(now)
local wait = wait_all(now)
if wait > 0 then
  if ARGV[REST] ~= '' and held(now, ARGV[REST + 2]) then return 1 end
  return { 1, fmt(wait) }
end
if not take_slot(now, ARGV[REST], tonumber(ARGV[REST + 1]), ARGV[REST + 2]) then
  if held(now, ARGV[REST + 2]) then return 1 end
  return { 2, '0' }
end
book_all(now, 0)
save(now)
return 1
