-- reserve (state::reserve): book c in every bucket at the latest of their
-- earliest times, or nothing if that is beyond max_wait.
-- ARGV[REST] max_wait. Returns {booked, wait, now, since} as strings (since:
-- now, or the earliest nb of the buckets charged if later); when booked
-- with no wait and since is now, now alone (no reply table to build).
local now = read_now()
load(now)
local held = nil
for i = 1, N do
  if tonumber(c[i]) > 0 and (held == nil or nb[i] < held) then
    held = nb[i]
  end
end
local since = now
if held ~= nil and held > now then
  since = held
end
local wait = wait_all(now)
if wait > tonumber(ARGV[REST]) then
  return { 0, fmt(wait), fmt(now), fmt(since) }
end
book_all(now, wait)
save(now)
if wait == 0 and since == now then
  return fmt(now)
end
return { 1, fmt(wait), fmt(now), fmt(since) }
