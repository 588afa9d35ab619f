-- release (state::release): free the slot held under a lease. Idempotent.
-- ARGV[REST] lease id. Returns 1 if it was held.
return call('ZREM', KEYS[2], ARGV[REST])
