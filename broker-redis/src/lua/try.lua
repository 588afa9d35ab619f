-- try (state::try_acquire): take c from every bucket and a slot, or nothing.
-- ARGV[REST] max_concurrent ('' for none), ARGV[REST+1] lease_ttl,
-- ARGV[REST+2] lease id. Returns {allowed, wait, reason}: reason 0 allowed,
-- 1 rate, 2 concurrency; wait as a string.
local now = read_now()
load(now)
local wait = wait_all(now)
if wait > 0 then
  return { 0, fmt(wait), 1 }
end
if not hold_slot(now, ARGV[REST], tonumber(ARGV[REST + 1]), ARGV[REST + 2]) then
  return { 0, '0', 2 }
end
book_all(now, 0)
save(now)
return { 1, '0', 0 }
