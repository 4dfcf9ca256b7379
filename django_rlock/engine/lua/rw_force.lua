-- A read or write lock's force unlock: a read lock's leaves a write lock alone, and the
-- reverse.
-- KEYS[1] hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] message, ARGV[2] the mode this lock deletes.
-- Reply: 1 deleted, 0 not in that mode.

-- #include rw

if redis.call('hget', KEYS[1], 'mode') ~= ARGV[2] then
  return 0
end
dropreads(KEYS[1])
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
