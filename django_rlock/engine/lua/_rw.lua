-- Snippet: names and sums every read-write lock script needs: `tkeys(key, field)`,
-- `maxread(key)`, `settle(key, channel, index, msg)`, `dropreads(key)`. `tkeys` is
-- naming.suffix_name(key, field .. ':rwlock_timeout') (Redisson's brace rule): scripts must
-- name *other* owners' timeout keys, which no caller could pass in (a test checks both agree).

local function tkeys(key, field)
  if string.find(key, '{', 1, true) then return key .. ':' .. field .. ':rwlock_timeout' end
  return '{' .. key .. '}:' .. field .. ':rwlock_timeout'
end
-- The longest PTTL over every live read hold's timeout key (-2 or less: none is alive).
local function maxread(key)
  local m = -3
  local f = redis.call('hgetall', key)
  for i = 1, #f, 2 do
    local c = tonumber(f[i + 1])
    if f[i] ~= 'mode' and c and string.sub(f[i], -6) ~= ':write' then
      local p = tkeys(key, f[i])
      for k = 1, c do m = math.max(m, redis.call('pttl', p .. ':' .. k)) end
    end
  end
  return m
end
-- After a hold left: keep the hash as long as its longest live read hold (never shorter than
-- a writer's lease in write mode), or delete it, unlist it and publish when nothing is left.
-- Returns true if the lock still exists.
local function settle(key, channel, index, msg)
  local mode = redis.call('hget', key, 'mode')
  if redis.call('hlen', key) > 1 then
    local m = maxread(key)
    if mode == 'write' then
      if m > redis.call('pttl', key) then redis.call('pexpire', key, m) end
      return true
    end
    if m > 0 then
      redis.call('pexpire', key, m)
      return true
    end
  end
  redis.call('del', key)
  redis.call('hdel', index, key)
  redis.call('publish', channel, msg)
  return false
end
-- Drop every read hold's timeout key (force unlock).
local function dropreads(key)
  local f = redis.call('hgetall', key)
  for i = 1, #f, 2 do
    local c = tonumber(f[i + 1])
    if f[i] ~= 'mode' and c then
      local p = tkeys(key, f[i])
      for k = 1, c do redis.call('del', p .. ':' .. k) end
    end
  end
end
