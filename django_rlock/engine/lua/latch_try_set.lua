-- CountDownLatch's try_set_count: sets the count unless the latch has one.
-- KEYS[1] key, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] count.
-- Reply: 1 = set, 0 = it has one.

if redis.call('exists', KEYS[1]) == 1 then return 0 end
redis.call('set', KEYS[1], ARGV[1])
-- #include stamp
redis.call('hset', KEYS[3], KEYS[1], stamp .. ' {"kind":"latch"}')
redis.call('publish', KEYS[2], '1')
return 1
