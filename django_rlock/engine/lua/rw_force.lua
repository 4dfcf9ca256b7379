-- The one force-unlock of a read-write lock, from any of its handles: the lock in either
-- mode, with every read hold's timeout key; every waiter (reader or writer) is woken.
-- KEYS[1] hash, KEYS[2] channel, KEYS[3] index.
-- ARGV[1] message.
-- Reply: 1 deleted, 0 not locked.

-- #include rw

if redis.call('type', KEYS[1]).ok ~= 'hash' then
  return 0
end
dropreads(KEYS[1])
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
