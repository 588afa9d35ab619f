-- turn (store::Turns): fair queuing by virtual time, per state and priority. KEYS: zsets
-- flow -> virtual time, flow -> last seen. ARGV[REST ..] flow, weight, units (us), active (us),
-- last ('1': last waiter). Returns 1 when within one quantum (units / weight) of the least, else 0.
local now = args()
local flow, weight = ARGV[REST], tonumber(ARGV[REST + 1])
local units, active = tonumber(ARGV[REST + 2]), tonumber(ARGV[REST + 3])
local last = ARGV[REST + 4] == '1'
local gone = call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. fmt(now - active), 'LIMIT', 0, 64)
if #gone > 0 then
  call('ZREM', KEYS[1], unpack(gone))
  call('ZREM', KEYS[2], unpack(gone))
end
local quantum = units / weight
local least = tonumber(call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) or 0
local own = tonumber(call('ZSCORE', KEYS[1], flow)) or least
-- A margin far below any quantum for the rounding of the sums.
local yours = own <= least + quantum + 1e-3
if yours then own = own + quantum end
-- Its last waiter served, the flow stays one call's units more (another
-- process's waiter of it asking meanwhile keeps its virtual time).
local seen = now
if yours and last then seen = now - active + units end
call('ZADD', KEYS[1], own, flow)
call('ZADD', KEYS[2], seen, flow)
call('PEXPIRE', KEYS[1], pttl(active))
call('PEXPIRE', KEYS[2], pttl(active))
if yours then return 1 end
return 0
