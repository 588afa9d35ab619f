-- penalty_left (state::penalty_left): how long, from now, a call of c is
-- still under a penalty, whatever the tokens; '0' for none.
local now = args()
load(now)
local left = 0
if N == 0 and penalty > now then
  left = penalty - now
end
for i = 1, N do
  if tonumber(c[i]) > 0 then
    left = max(left, nb[i] - max(now, ts[i]))
  end
end
return fmt(left)
