-- ReadLock's release (and the watchdog's, of every hold of an owner that ended).
-- KEYS[1] hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] reader field, ARGV[2] lease ms (unused: each read hold has its own expiry),
-- ARGV[3] message, ARGV[4] (optional) "all": drop every hold of that owner (its thread or task
-- ended).
-- Reply: nil = not a reader; 0 = it still has read holds; 1 = it has none left.

-- #include rw

local c = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if redis.call('hget', KEYS[1], 'mode') == false or not c then
  return nil
end
local p = tkeys(KEYS[1], ARGV[1])
local n = c - 1
if ARGV[4] == 'all' then n = 0 end
if n <= 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
else
  redis.call('hset', KEYS[1], ARGV[1], n)
end
for k = math.max(n, 0) + 1, c do redis.call('del', p .. ':' .. k) end
if settle(KEYS[1], KEYS[2], KEYS[3], ARGV[3]) and n > 0 then
  return 0
end
return 1
