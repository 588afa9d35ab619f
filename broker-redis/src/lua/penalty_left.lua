-- penalty_left (state::penalty_left): how long, from now, a call of c is
-- still under a 429's or a spent counter's penalty, whatever the tokens:
-- the latest nb of the buckets with a non-zero c, each from its own time
-- (max(now, ts), as wait_all reads it), or with no bucket the state's
-- penalty; '0' for none. Writes nothing but what load writes (a state of
-- another number of buckets, taken on as every transition takes it on).
args()
local now = read_now()
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
