-- PermitExpirableSemaphore's add_permits.
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV[1] permits to add (may be negative).
-- Reply: permits available now.

-- #include permits

reclaim(now)
made(KEYS[1], KEYS[4])
local v = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(ARGV[1])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[3], v)
return v
