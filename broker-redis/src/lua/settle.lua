-- settle (state::settle, bucket::settle): c is delta = reserved - actual;
-- a positive delta refunds (capped at capacity), a negative one charges.
-- ARGV[REST] is the settled reservation's mark in us (Reservation::since;
-- '' when there is none: now). No refund if the bucket is held past it (nb
-- after it): the hold came after the booking, and its drain took tokens.
local now = read_now()
load(now)
local since = tonumber(ARGV[REST])
for i = 1, N do
  local delta = tonumber(c[i])
  if delta ~= 0 then
    local n = max(now, ts[i])
    tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
    if delta < 0 or nb[i] <= (since or n) then
      tokens[i] = min(tokens[i] + delta, capacity[i])
    end
  end
end
save(now)
return 1
