-- NonReentrantLock's acquire (Redisson 4.4's layout and reply): RLock's hash, one hold per
-- owner.
-- KEYS[1] lock hash, KEYS[2] index.
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] holder info, ARGV[4] "fresh" (the owner holds
-- nothing as far as its process knows: a field of its is a hold whose reply was lost, taken
-- as a new hold) or "".
-- Reply: nil = acquired (count 1); the holder's PTTL (-1: no expiry); or the error
-- NON_REENTRANT_REACQUIRE when the owner holds it already.

if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include now_ms
  -- #include stamped
  redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[4] ~= 'fresh' then
    return redis.error_reply('NON_REENTRANT_REACQUIRE')
  end
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
