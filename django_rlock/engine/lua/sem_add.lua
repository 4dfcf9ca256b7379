-- Semaphore's add_permits.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] permits to add (may be negative).
-- Reply: permits now.

-- #include made KIND=semaphore

made(KEYS[1], KEYS[3])
local v = tonumber(redis.call('get', KEYS[1]) or 0) + tonumber(ARGV[1])
redis.call('set', KEYS[1], v)
redis.call('publish', KEYS[2], v)
return v
