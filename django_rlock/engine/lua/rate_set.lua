-- RateLimiter's set_rate / try_set_rate. Unlike Redisson's setRate, the grants of the window
-- are kept: the counter is recounted against the new rate and interval, so a new rate never
-- hands out a fresh budget on top of what was just granted. Waiters are woken to re-check.
-- KEYS[1..5] as in _rate.lua, KEYS[6] the index.
-- ARGV[1] rate, ARGV[2] interval (ms), ARGV[3] '1' = only if no rate is set, ARGV[4] channel,
-- ARGV[5] keepAliveTime (ms; 0 = none: the keys live until deleted).
-- Reply: 1 set, 0 kept the rate it had (try_set_rate).

-- #include rate

if ARGV[3] == '1' and redis.call('hexists', KEYS[1], 'rate') == 1 then return 0 end
-- #include stamp
redis.call('hsetnx', KEYS[6], KEYS[1], stamp .. ' {"kind":"rate"}')
local old = redis.call('hget', KEYS[1], 'type')
redis.call('hset', KEYS[1], 'rate', ARGV[1], 'interval', ARGV[2], 'type', '0',
           'keepAliveTime', ARGV[5])
if ARGV[5] == '0' then redis.call('persist', KEYS[1]); redis.call('persist', KEYS[2]);
  redis.call('persist', KEYS[3]) end
if old and old ~= '0' then redis.call('del', KEYS[2], KEYS[3]) end
local rate, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local edge = '(' .. ms(now_ms - interval)
redis.call('zremrangebyscore', KEYS[3], '-inf', edge)
redis.call('set', KEYS[2], rate - permits_of(redis.call('zrange', KEYS[3], 0, -1)), 'KEEPTTL')
rate_touch()
redis.call('publish', ARGV[4], '1')
return 1
