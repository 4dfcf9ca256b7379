-- Drops every hold of one owner that can never release it (its thread or task has ended).
-- KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] owner, ARGV[2] message.
-- Reply: 1 deleted, 0 not held by it.

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call('hdel', KEYS[3], KEYS[1])
  redis.call('publish', KEYS[2], ARGV[2])
  return 1
end
return 0
