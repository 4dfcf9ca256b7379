-- Semaphore's try_set_permits: sets the count unless it has one.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] permits.
-- Reply: 1 = set (it had none), 0 = kept its own.

-- #include made KIND=semaphore

if redis.call('exists', KEYS[1]) == 1 then return 0 end
made(KEYS[1], KEYS[3])
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
