-- The force-unlock of a semaphore (and of a string that may be a semaphore or a latch): the
-- counter and the permits taken go, the waiters are woken. A key recreated as something else
-- since a listing read it is left alone.
-- KEYS[1] the counter, KEYS[2] the zset of permits taken (none for a plain semaphore), KEYS[3]
-- index.
-- ARGV[1] channel, ARGV[2] message, ARGV[3], ARGV[4] (optional) a second channel and message.
-- Reply: 1 deleted, 0 none.

if redis.call('type', KEYS[1]).ok ~= 'string' then return 0 end
redis.call('del', KEYS[1], KEYS[2])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
if ARGV[3] then redis.call('publish', ARGV[3], ARGV[4]) end
return 1
