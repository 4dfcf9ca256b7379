-- The watchdog's renewal of permits, batched.
-- KEYS = timeout zsets.
-- ARGV = (permit id hex, lease ms) per key.
-- Reply: 1 per permit still there (its expiry moved to now + lease), else 0 (lost).

-- #include permit_time

local now = now_ms()
local result = {}
for i = 1, #KEYS do
  local id = raw(ARGV[2 * i - 1])
  if redis.call('zscore', KEYS[i], id) then
    redis.call('zadd', KEYS[i], 'XX', ms(now + tonumber(ARGV[2 * i])), id)
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
