-- A semaphore's (or permit semaphore's) delete.
-- KEYS[1..n-1] keys, KEYS[n] index.
-- ARGV: none.
-- Reply: keys deleted.

local n = 0
for i = 1, #KEYS - 1 do n = n + redis.call('del', KEYS[i]) end
redis.call('hdel', KEYS[#KEYS], KEYS[1])
return n
