-- try (state::try_acquire): take c from every bucket and a slot, or nothing.
-- ARGV[REST..REST+2] max_concurrent ('' none), lease_ttl, lease id.
-- Returns 1, or {reason (1 rate, 2 concurrency), wait}.
local now = args()
load(now)
local wait = wait_all(now)
if wait == 0 and take_slot(now, ARGV[REST], tonumber(ARGV[REST + 1]), ARGV[REST + 2]) then
  book_all(now, 0)
  save(now)
  return 1
end
-- Denied, unless this decision ran before (see held).
if ARGV[REST] ~= '' and held(now, ARGV[REST + 2]) then return 1 end
if wait > 0 then return { 1, fmt(wait) } end
return { 2, '0' }
