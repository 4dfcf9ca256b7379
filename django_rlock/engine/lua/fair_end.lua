-- The watchdog's release of a fair-lock hold whose owner ended.
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters.
-- ARGV[1] owner, ARGV[2] message.
-- Reply: 1 deleted (the head woken, its turn begun if it is ours), 0 not held by it.

-- #include fair

if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
local _, head = prune()
if head then
  begin(ARGV[2], head, nil, own(head))
  keep()
end
notify(ARGV[2], head)
return 1
