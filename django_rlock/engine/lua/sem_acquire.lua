-- Semaphore's acquire: takes permits if enough are available.
-- KEYS[1] key.
-- ARGV[1] permits.
-- Reply: 1 = taken, 0 = not enough.

local v = redis.call('get', KEYS[1])
if v ~= false and tonumber(v) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  return 1
end
return 0
