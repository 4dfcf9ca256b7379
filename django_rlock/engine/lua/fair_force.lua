-- FairLock's force unlock (Redisson's): the queue stays, its head is woken (its turn begun if it
-- is ours). A key recreated as something else since a listing read it is left alone (its line
-- still loses its dead waiters).
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters.
-- ARGV[1] message.
-- Reply: 1 deleted (the head woken), 0 not locked.

-- #include fair

local _, head = prune()
if redis.call('type', KEYS[1]).ok ~= 'hash' then
  if head then keep() end
  return 0
end
redis.call('hdel', KEYS[3], KEYS[1])
local deleted = redis.call('del', KEYS[1]) == 1
if deleted and head then begin(ARGV[1], head, nil, own(head)) end
if head then keep() end
if deleted then
  notify(ARGV[1], head)
  return 1
end
return 0
