-- settle (state::settle): c is booked - actual (refund if positive, else
-- charge). ARGV[REST .. REST + 3] marks ('' for none), ARGV[REST + 4] due time;
-- KEYS[3], if given, is set for ARGV[REST + 5] ms so a resend changes nothing.
local now = args()
if KEYS[3] ~= nil and not call('SET', KEYS[3], 1, 'NX', 'PX', ARGV[REST + 5]) then
  return 0
end
load(now)
local due = tonumber(ARGV[REST + 4])
for i = 1, N do
  local delta = tonumber(c[i])
  if delta ~= 0 then
    local n = max(now, ts[i])
    tokens[i], ts[i] = refill(tokens[i], ts[i], n, capacity[i], amount[i], period[i])
    local since = tonumber(ARGV[REST + min(i, 4) - 1])
    if delta < 0 or nb[i] <= (since or n) then
      if delta > 0 and due then
        delta = unclaimed(tokens[i], nb[i], n, delta, due, amount[i], period[i])
      end
      tokens[i] = min(tokens[i] + delta, capacity[i])
    end
  end
end
save(now)
return 1
