-- try (state::try_acquire): take c from every bucket and a slot, or nothing.
-- ARGV[REST] max_concurrent ('' for none), ARGV[REST+1] lease_ttl,
-- ARGV[REST+2] lease id. Returns 1 when allowed; when denied, {reason,
-- wait}: reason 1 rate, 2 concurrency.
-- Several decisions in one call (coalesce.rs): KEYS holds each one's two
-- keys and ARGV each one's 6 + 4n ARGV, in turn. Each is applied in order
-- as its own call would be; the reply is the list of theirs, an error as
-- {0, its text} (nested error replies would fail the whole reply).
local function try()
  args()
  local now = read_now()
  load(now)
  local wait = wait_all(now)
  if wait > 0 then
    if ARGV[REST] ~= '' and held(now, ARGV[REST + 2]) then return 1 end
    return { 1, fmt(wait) }
  end
  if not take_slot(now, ARGV[REST], tonumber(ARGV[REST + 1]), ARGV[REST + 2]) then
    if held(now, ARGV[REST + 2]) then return 1 end
    return { 2, '0' }
  end
  book_all(now, 0)
  save(now)
  return 1
end

if #KEYS == 2 then return try() end
local all_keys, all_argv, out, a = KEYS, ARGV, {}, 1
for d = 1, #all_keys / 2 do
  local m = 6 + 4 * tonumber(all_argv[a + 2])
  KEYS, ARGV = { all_keys[2 * d - 1], all_keys[2 * d] }, { unpack(all_argv, a, a + m - 1) }
  a = a + m
  local ok, r = pcall(try)
  if not ok then
    if type(r) == 'table' and r.err ~= nil then r = r.err end
    r = { 0, (string.gsub(tostring(r), '[\r\n]', ' ')) }
  end
  out[d] = r
end
return out
