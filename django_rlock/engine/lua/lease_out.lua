-- Turns one owner's last hold into a plain lease (``hold_at_least``, ShedLock's
-- lockAtLeastFor): the lock stays held, by a field nobody can release or re-enter, until the
-- lease runs out on the server's clock; no process renews it.
-- KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] the owner's field, ARGV[2] the lease's field, ARGV[3] lease ms, ARGV[4] message.
-- Reply: nil = not held by that owner; 0 = a reentrant hold (one level released, as a
-- release would, still held by the owner); 1 = the lock is now a lease of ARGV[3] ms.

local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not count then
  return nil
end
if count > 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], -1)
  return 0
end
local before = redis.call('pttl', KEYS[1])
redis.call('hdel', KEYS[1], ARGV[1])
redis.call('hset', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[3])
-- The index entry names the lease's field, so listings show who left it.
local entry = redis.call('hget', KEYS[3], KEYS[1])
if entry then
  local at, to = string.find(entry, '"' .. ARGV[1] .. '"', 1, true)
  if at then
    redis.call('hset', KEYS[3], KEYS[1],
      string.sub(entry, 1, at) .. ARGV[2] .. string.sub(entry, to))
  end
end
-- Waiters parked on the longer TTL they read would sleep past the lease: they look again.
if before < 0 or before > tonumber(ARGV[3]) then
  redis.call('publish', KEYS[2], ARGV[4])
end
return 1
