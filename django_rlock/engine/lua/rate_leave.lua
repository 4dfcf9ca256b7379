-- RateLimiter: a waiter that gives up takes its place out of line; a cancelled asyncio acquire
-- whose grant landed anyway gives back exactly that grant (by its id), nobody else's.
-- KEYS[1..5] as in _rate.lua.
-- ARGV[1] waiter member ("<token>|<permits>", '' = none), ARGV[2] grant id ('' = none),
-- ARGV[3] its permits.
-- Reply: 1 if a grant was given back, else 0.

redis.call('zrem', KEYS[4], ARGV[1])
redis.call('zrem', KEYS[5], ARGV[1])
if ARGV[2] == '' then return 0 end
local n = tonumber(ARGV[3])
if redis.call('zrem', KEYS[3], struct.pack('Bc0I', string.len(ARGV[2]), ARGV[2], n)) == 0 then
  return 0
end
if redis.call('exists', KEYS[2]) == 1 then redis.call('incrby', KEYS[2], n) end
return 1
