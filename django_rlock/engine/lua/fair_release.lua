-- FairLock's release: the head waiter is woken when the lock is gone, and its turn begun if it
-- is ours (`begin`).
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters.
-- ARGV[1] owner, ARGV[2] lease ms in force, ARGV[3] message.
-- Reply: nil = not held by the owner (the head is woken if the lock is gone); 0 = still held;
-- 1 = released (the head, if any, woken).

-- #include fair

local _, head = prune()
-- The lock is gone: the head's turn.
local function hand_on()
  if head then
    begin(ARGV[3], head, nil, own(head))
    keep()
  end
  notify(ARGV[3], head)
end
if redis.call('exists', KEYS[1]) == 0 then
  hand_on()
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  if head then keep() end
  return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  if head then keep() end
  return 0
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
hand_on()
return 1
