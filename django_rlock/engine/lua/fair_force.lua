-- FairLock's force unlock. The queue stays.
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset.
-- ARGV[1] message.
-- Reply: 1 deleted (the head woken), 0 not locked.

-- #include fair

prune()
redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  notify(ARGV[1])
  return 1
end
return 0
