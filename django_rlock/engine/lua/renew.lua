-- The watchdog's renewal of lock hashes, batched.
-- KEYS = lock hashes.
-- ARGV = owner, lease ms for each key in turn.
-- Reply: one 1 (renewed) or 0 (gone or no longer ours: lost) per key.

local result = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2 * i])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
