-- release (state::release): free the slot held under a lease. Idempotent.
-- ARGV[REST] lease id. Returns 1 if it was held.
args()
return call('ZREM', KEYS[2], ARGV[REST])
