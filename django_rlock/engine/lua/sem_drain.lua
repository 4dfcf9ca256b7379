-- Semaphore's drain_permits.
-- KEYS[1] key.
-- ARGV: none.
-- Reply: the permits taken (all there were).

local v = redis.call('get', KEYS[1])
if v == false then return 0 end
redis.call('set', KEYS[1], 0)
return tonumber(v)
