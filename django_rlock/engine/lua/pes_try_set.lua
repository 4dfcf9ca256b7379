-- PermitExpirableSemaphore's try_set_permits. A semaphore whose counter is gone while permits
-- are still out (the key alone deleted) counts those as taken: at most ARGV[1] permits are
-- ever out at once. Expired ones are dropped (nothing counts them back).
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV[1] permits.
-- Reply: 1 = set, 0 = it has a count already.

-- #include permits

if redis.call('exists', KEYS[1]) == 1 then
  reclaim(now)
  return 0
end
redis.call('zremrangebyscore', KEYS[2], '-inf', ms(now))
local v = tonumber(ARGV[1]) - redis.call('zcard', KEYS[2])
made(KEYS[1], KEYS[4])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[3], v)
return 1
