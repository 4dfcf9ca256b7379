-- PermitExpirableSemaphore's acquire of one permit.
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV[1] permit id (hex), ARGV[2] lease ms, ARGV[3] optional: '1' = the semaphore expires when
-- idle (pes_release's ARGV[2]): a permit taken makes it persistent again.
-- Reply: nil = taken; else ms to the nearest expiry of a taken permit (-1: none has one).

-- #include permits

reclaim(now)
local v = redis.call('get', KEYS[1])
if v ~= false and tonumber(v) >= 1 then
  redis.call('decr', KEYS[1])
  redis.call('zadd', KEYS[2], ms(now + tonumber(ARGV[2])), raw(ARGV[1]))
  if ARGV[3] == '1' then
    redis.call('persist', KEYS[1])
  else
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
  end
  return nil
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] then return math.max(0, tonumber(first[2]) - now) end
return -1
