-- WriteLock's acquire. Reentry sets the lease like RLock's (Redisson adds it to the PTTL,
-- which grows without bound), but never below the writer's own read holds.
-- KEYS[1] hash, KEYS[2] index.
-- ARGV[1] lease ms, ARGV[2] writer field <owner>:write, ARGV[3] holder info.
-- Reply: nil = acquired, else the hash's PTTL.

-- #include rw

local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include now_ms
  -- #include stamped
  redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local ms = tonumber(ARGV[1])
  if redis.call('hlen', KEYS[1]) > 2 then ms = math.max(ms, redis.call('pttl', KEYS[1])) end
  redis.call('pexpire', KEYS[1], ms)
  return nil
end
return redis.call('pttl', KEYS[1])
