-- Snippet: what every PermitExpirableSemaphore script but the renewal starts with: `made`,
-- the permit time helpers, `reclaim(now)` (expired permits dropped, counted back and
-- published) and `now`. Those scripts take KEYS[1] key (permits available), KEYS[2] timeout
-- zset, KEYS[3] channel, KEYS[4] index.

-- #include made KIND=permits

-- #include permit_time

local function reclaim(now)
  local n = redis.call('zremrangebyscore', KEYS[2], expired(now))
  if n > 0 then
    made(KEYS[1], KEYS[4])
    redis.call('publish', KEYS[3], redis.call('incrby', KEYS[1], n))
  end
end
local now = now_ms()
