-- WriteLock's release. If the writer still has read holds, the lock becomes a read lock
-- (downgrade) and waiting readers are woken (Redisson publishes nothing then, so they would
-- wait out the PTTL).
-- KEYS[1] hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] writer field, ARGV[2] lease ms in force, ARGV[3] message, ARGV[4] (optional) "all"
-- (the owner ended).
-- Reply: nil = not the writer; 0 = still held; 1 = write lock released.

-- #include rw

if redis.call('hget', KEYS[1], 'mode') ~= 'write' or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return nil
end
if ARGV[4] ~= 'all' and redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  local ms = tonumber(ARGV[2])
  if redis.call('hlen', KEYS[1]) > 2 then ms = math.max(ms, redis.call('pttl', KEYS[1])) end
  redis.call('pexpire', KEYS[1], ms)
  return 0
end
redis.call('hdel', KEYS[1], ARGV[1])
if redis.call('hlen', KEYS[1]) > 1 then
  redis.call('hset', KEYS[1], 'mode', 'read')
  if settle(KEYS[1], KEYS[2], KEYS[3], ARGV[3]) then
    redis.call('publish', KEYS[2], ARGV[3])
  end
  return 1
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', KEYS[2], ARGV[3])
return 1
