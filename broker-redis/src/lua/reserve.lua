-- reserve (state::reserve): book c in every bucket at the latest of their
-- earliest times, or nothing if that is beyond max_wait.
-- ARGV[REST] max_wait. Returns {booked, wait, now}; wait and now as strings.
local now = read_now()
local params, states, costs = load(now)
local wait = wait_all(params, states, costs, now)
if wait > tonumber(ARGV[REST]) then
  return { 0, fmt(wait), fmt(now) }
end
book_all(params, states, costs, now, wait)
save(params, states, now)
return { 1, fmt(wait), fmt(now) }
