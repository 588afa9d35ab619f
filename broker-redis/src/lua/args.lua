-- The per-call part of common.lua, read from ARGV before the transition.
N = tonumber(ARGV[3])
REST = 4 + 4 * N
