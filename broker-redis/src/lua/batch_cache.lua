-- The write-back cache of a batch (try_batch.lua): a local `redis` table that
-- reads each bucket hash once and writes it back once at the end; TIME is read once.
local real_call = redis.call
-- key -> { f = field -> value (the whole hash, read once), w = fields
-- written, deleted, ttl = last PEXPIRE }
local cache = {}
local batch_time

local real_tonumber = tonumber
local numbers = {}
local function tonumber(s)
  local x = numbers[s]
  if x == nil then
    x = real_tonumber(s)
    if x ~= nil and type(s) == 'string' then
      numbers[s] = x
    end
  end
  return x
end

local function cached_call(cmd, key, ...)
  if cmd == 'TIME' then
    batch_time = batch_time or real_call('TIME')
    return batch_time
  end
  local c = cache[key]
  if c == nil and (cmd == 'HMGET' or cmd == 'HSET') then
    c = { f = {}, w = {}, deleted = false }
    local all = real_call('HGETALL', key)
    for i = 1, #all, 2 do
      c.f[all[i]] = all[i + 1]
    end
    cache[key] = c
  end
  if cmd == 'HMGET' then
    local out = { ... }
    for i = 1, #out do
      out[i] = c.f[out[i]] or false
    end
    return out
  elseif cmd == 'HSET' then
    local args = { ... }
    for i = 1, #args, 2 do
      c.f[args[i]] = args[i + 1]
      c.w[args[i]] = true
    end
    return 0
  elseif cmd == 'DEL' and select('#', ...) == 0 then
    cache[key] = { f = {}, w = {}, deleted = true }
    return 1
  elseif cmd == 'PEXPIRE' and c ~= nil then
    c.ttl = ...
    return 1
  end
  return real_call(cmd, key, ...)
end

local function write_back()
  for key, c in pairs(cache) do
    if c.deleted then
      real_call('DEL', key)
    end
    local fields = {}
    for name in pairs(c.w) do
      fields[#fields + 1] = name
      fields[#fields + 1] = c.f[name]
    end
    if #fields > 0 then
      real_call('HSET', key, unpack(fields))
    end
    if c.ttl ~= nil then
      real_call('PEXPIRE', key, c.ttl)
    end
  end
end

local redis = setmetatable({ call = cached_call }, { __index = redis })
