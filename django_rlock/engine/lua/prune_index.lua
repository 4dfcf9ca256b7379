-- Drops index entries of locks read as gone, unless the key exists again (taken since the
-- read): a listing never unlists a live lock.
-- KEYS[1] index, KEYS[2..n] lock keys read as gone.
-- ARGV: none.
-- Reply: how many entries were dropped.

local n = 0
for i = 2, #KEYS do
  if redis.call('exists', KEYS[i]) == 0 then
    n = n + redis.call('hdel', KEYS[1], KEYS[i])
  end
end
return n
