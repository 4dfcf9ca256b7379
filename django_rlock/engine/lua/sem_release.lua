-- Semaphore's release: gives permits back, and publishes the count.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] permits.
-- Reply: permits now.

-- #include made KIND=semaphore

made(KEYS[1], KEYS[3])
local v = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], v)
return v
