-- FairLock's acquire: queues the caller (Redisson's deadline math) unless it gets the lock.
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset.
-- ARGV[1] lease ms, ARGV[2] owner, ARGV[3] holder info, ARGV[4] allowance ms (0: the no-wait
-- variant, which never queues), ARGV[5] message.
-- Reply: nil = acquired (new or reentrant); else how long (ms) the caller may park at most:
-- the holder's PTTL (-1: no expiry), or, the lock being free with another waiter first in
-- line, that waiter's time left (capped by the caller's lease).
-- A line left behind expires at its last deadline plus the slack (`keep`); with nobody in
-- line (the uncontended path) the queue costs one LINDEX.

-- #include fair

local pruned, head = prune()
local free = redis.call('exists', KEYS[1]) == 0
if free and (not head or head == ARGV[2]) then
  if head then
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], ARGV[2])
    local wait = tonumber(ARGV[4])
    if wait > 0 then
      local rest = redis.call('zrange', KEYS[5], 0, -1)
      for i = 1, #rest do redis.call('zincrby', KEYS[5], -wait, rest[i]) end
    end
    keep()
  end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include stamped
  redis.call('hset', KEYS[3], KEYS[1], stamped(ARGV[3], now))
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  if head then keep() end
  return nil
end
if pruned > 0 and free then notify(ARGV[5], head) end
local pttl = redis.call('pttl', KEYS[1])
local wait = tonumber(ARGV[4])
if wait == 0 then
  if head then keep() end
  return math.max(0, pttl)
end
if not redis.call('zscore', KEYS[5], ARGV[2]) then
  local last = redis.call('lindex', KEYS[4], -1)
  local base = last and tonumber(redis.call('zscore', KEYS[5], last))
  if not base then base = now + math.max(0, pttl) end
  if redis.call('zadd', KEYS[5], base + wait, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[4], ARGV[2])
  end
end
keep()
if free then
  local s = tonumber(redis.call('zscore', KEYS[5], head)) or now
  return math.max(0, math.min(s - now, tonumber(ARGV[1])))
end
return pttl
