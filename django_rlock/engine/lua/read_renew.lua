-- The watchdog's renewal of read holds, batched like renew.lua. Renews only that owner's own
-- read holds (never another client's: Redisson #7098 renewed dead readers forever), and keeps
-- the hash at least as long.
-- KEYS = hashes.
-- ARGV = (reader field, lease ms) per key.
-- Reply: per key, 1 renewed, 0 lost (no field, or none of its timeout keys left: the others
-- may already treat it as gone).

-- #include rw

local result = {}
for i = 1, #KEYS do
  local field, ms = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local c = tonumber(redis.call('hget', KEYS[i], field))
  local alive = 0
  if c then
    local p = tkeys(KEYS[i], field)
    for k = 1, c do alive = alive + redis.call('pexpire', p .. ':' .. k, ms) end
  end
  if alive > 0 then
    if redis.call('pttl', KEYS[i]) < ms then redis.call('pexpire', KEYS[i], ms) end
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
