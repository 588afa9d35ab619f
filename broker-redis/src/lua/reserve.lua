-- reserve (state::reserve): book c in every bucket at the latest of their
-- earliest times, or nothing if that is beyond max_wait.
-- ARGV[REST] max_wait. Returns {booked, wait, now}, wait and now as
-- strings; when booked with no wait, now alone (no reply table to build).
local now = read_now()
load(now)
local wait = wait_all(now)
if wait > tonumber(ARGV[REST]) then
  return { 0, fmt(wait), fmt(now) }
end
book_all(now, wait)
save(now)
if wait == 0 then
  return fmt(now)
end
return { 1, fmt(wait), fmt(now) }
