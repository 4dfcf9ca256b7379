-- ReadLock's acquire. Readers enter in read mode, or in write mode when they are the writer
-- (downgrade). The hash lives at least as long as its longest read hold.
-- KEYS[1] hash, KEYS[2] index.
-- ARGV[1] lease ms, ARGV[2] reader field <owner>, ARGV[3] holder info, ARGV[4] the same
-- owner's writer field.
-- Reply: nil = acquired, else the hash's PTTL.

-- #include rw

local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', tkeys(KEYS[1], ARGV[2]) .. ':1', 1, 'px', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include now_ms
  -- #include stamped
  redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[4]) == 1) then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', tkeys(KEYS[1], ARGV[2]) .. ':' .. n, 1, 'px', ARGV[1])
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[1])
  end
  return nil
end
return redis.call('pttl', KEYS[1])
