-- book (state::book): book c in every bucket, or nothing if beyond max_wait (ARGV[REST]).
-- Returns {booked, wait, now, mark 1..4} (state::Marks; the 4th shared by later buckets).
local now = args()
load(now)
local marks = { now, now, now, now }
for i = 1, N do
  local m = (tonumber(c[i]) > 0 and nb[i] > now) and nb[i] or now
  marks[min(i, 4)] = i <= 4 and m or min(marks[4], m)
end
local wait = wait_all(now)
local function reply(booked)
  return { booked, fmt(wait), fmt(now), fmt(marks[1]), fmt(marks[2]), fmt(marks[3]), fmt(marks[4]) }
end
if wait > tonumber(ARGV[REST]) then
  return reply(0)
end
book_all(now, wait)
save(now)
return reply(1)
