-- CountDownLatch's count_down: the latch opens (is deleted, and published) at 0.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV: none.
-- Reply: the count now (0 when it is open).

local v = redis.call('decr', KEYS[1])
if v <= 0 then
  redis.call('del', KEYS[1])
  redis.call('hdel', KEYS[3], KEYS[1])
end
if v == 0 then redis.call('publish', KEYS[2], '0') end
return math.max(v, 0)
