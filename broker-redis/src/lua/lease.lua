-- Keeps the lease set as long as its latest lease, plus the margin.
local function keep_lease_set(now)
  local last = call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local keep = tonumber(last[2]) - now
  if keep < 0 then keep = 0 end
  local ms = min(ceil(keep / 1000), 1e15) + tonumber(ARGV[2])
  call('PEXPIRE', KEYS[2], ms)
end

-- state::hold_slot over the lease set; max_concurrent == '' means no
-- concurrency limit.
local function hold_slot(now, max_concurrent, lease_ttl, lease)
  if max_concurrent == '' then
    return true
  end
  call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if call('ZCARD', KEYS[2]) >= tonumber(max_concurrent) then
    return false
  end
  call('ZADD', KEYS[2], sat_add(now, lease_ttl), lease)
  keep_lease_set(now)
  return true
end

-- Whether `lease` is held and live. A decision's lease id is new, so it is
-- held only if this very decision ran before: the shared connection sends
-- a command again when its reply was lost with a broken pipe (see
-- connection.rs), and the first run may have granted the lease. A second
-- run that would deny answers as the first did instead, since a denied
-- caller never releases the lease that holds the slot. Asked on denials
-- only.
local function held(now, lease)
  local expiry = call('ZSCORE', KEYS[2], lease)
  return expiry and tonumber(expiry) > now
end
