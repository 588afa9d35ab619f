-- try for several decisions in one call, applied in order.
-- G_KEYS[2d - 1], G_KEYS[2d]  decision d's bucket hash and lease set
-- G_ARGV[1]                   the number of decisions
-- then for each decision      its ARGV count m, then its m ARGV
-- One reply per decision; an error replies {0, its text} and the next still run.
local out = {}
local a = 2
for d = 1, tonumber(G_ARGV[1]) do
  local m = tonumber(G_ARGV[a])
  KEYS = { G_KEYS[2 * d - 1], G_KEYS[2 * d] }
  ARGV = { unpack(G_ARGV, a + 1, a + m) }
  a = a + 1 + m
  local ok, r = pcall(try)
  if not ok then
    if type(r) == 'table' and r.err ~= nil then r = r.err end
    r = { 0, (string.gsub(tostring(r), '[\r\n]', ' ')) }
  end
  out[d] = r
end
write_back()
return out
