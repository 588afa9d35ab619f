-- try for several decisions in one call, each applied in order exactly as
-- its own call of try would apply it: the batch script defines the helpers
-- once, and try's body, unchanged, as try(), whose KEYS and ARGV are the
-- decision's slices.
-- G_KEYS[2d - 1], G_KEYS[2d]  decision d's bucket hash and lease set
-- G_ARGV[1]                   the number of decisions
-- then for each decision      its ARGV count m, then its m ARGV
-- Bucket hashes, TIME and numbers go through batch_cache.lua.
-- Replies with one reply per decision, in order; a decision that raises an
-- error replies {0, the error's text} (nested error replies would fail the
-- whole reply in clients), and the next ones still run.
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
