-- PermitExpirableSemaphore's taken permits as listing reads them, changing nothing: a permit
-- whose expiry has passed counts as free (the next write's `reclaim` counts it back), so a
-- crashed holder's permit is not shown taken once its lease is over.
-- KEYS[1] timeout zset.
-- ARGV[1] how many live permits to return with their expiry (0: the counts only).
-- Reply: {permits expired, permits live, {id (16 raw bytes), expiry ms, ...}: the first
-- ARGV[1] live permits, soonest expiry first}.

-- #include permit_time

local now = now_ms()
local gone = redis.call('zcount', KEYS[1], expired(now))
local live = redis.call('zcard', KEYS[1]) - gone
local shown = {}
local n = tonumber(ARGV[1])
if n > 0 and live > 0 then
  shown = redis.call('zrange', KEYS[1], gone, gone + n - 1, 'withscores')
end
return {gone, live, shown}
