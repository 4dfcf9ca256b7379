-- CountDownLatch's delete.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV: none.
-- Reply: 1 = deleted (and published), 0 = there was none.

redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], '1')
  return 1
end
return 0
