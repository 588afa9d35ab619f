-- A minimal token bucket, the raw-Redis anchor of bench/redis_compare.sh:
-- refill from the server's TIME, take one token if there is one, write
-- back with a TTL. KEYS[1] the bucket; ARGV[1] capacity, ARGV[2] tokens
-- per microsecond. Returns 1 when allowed, 0 when not.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or capacity, tonumber(b[2]) or now
tokens = math.min(capacity, tokens + (now - ts) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 60000)
return allowed
