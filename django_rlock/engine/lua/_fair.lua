-- Snippet: what every fair-lock script starts with: `now` (server time, ms), `prune()` and
-- `notify(msg)`. Every fair-lock script takes KEYS[1] lock hash, KEYS[2] lock channel (a
-- waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index, KEYS[4] queue list, KEYS[5] timeout zset.

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Drop the waiters first in line whose deadline has passed (or that have none); how many.
local function prune()
  local n = 0
  while true do
    local head = redis.call('lindex', KEYS[4], 0)
    if not head then return n end
    local s = tonumber(redis.call('zscore', KEYS[5], head))
    if s and s > now then return n end
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], head)
    n = n + 1
  end
end
-- Wake the waiter first in line, on its own channel.
local function notify(msg)
  local head = redis.call('lindex', KEYS[4], 0)
  if head then redis.call('publish', KEYS[2] .. ':' .. head, msg) end
end
