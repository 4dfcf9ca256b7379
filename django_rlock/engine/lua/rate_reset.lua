-- RateLimiter's force-unlock (a full budget at once: the window's grants and the line are
-- forgotten, the rate stays) and delete (everything, and its index entry). Waiters are woken.
-- KEYS[1..5] as in _rate.lua, KEYS[6] the index.
-- ARGV[1] channel, ARGV[2] '1' = delete the limiter too.
-- Reply: 1 if the limiter existed, else 0.

local found = redis.call('exists', KEYS[1])
redis.call('del', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
if ARGV[2] == '1' then
  redis.call('del', KEYS[1])
  redis.call('hdel', KEYS[6], KEYS[1])
end
redis.call('publish', ARGV[1], '1')
return found
