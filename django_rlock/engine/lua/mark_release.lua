-- Releases an enqueue de-duplication mark (see mark_claim.lua).
-- KEYS[1] mark, KEYS[2] (optional) index.
-- ARGV[1] field.
-- Reply: 1 if it was ours and is gone, else 0.

if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('del', KEYS[1])
  if KEYS[2] then
    redis.call('hdel', KEYS[2], KEYS[1])
  end
  return 1
end
return 0
