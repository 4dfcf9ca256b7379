-- RLock's force unlock: deletes the lock whoever holds it.
-- KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] message.
-- Reply: 1 deleted (and published), 0 none.

redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
return 0
