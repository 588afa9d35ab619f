-- The per-call part of one.lua: the bucket's parameters.
capacity, amount, period = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
