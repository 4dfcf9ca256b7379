-- Snippet: what every fair-lock script starts with: `now` (server time, ms), `prune()`,
-- `keep()` and `notify(msg, head)`. Every fair-lock script takes KEYS[1] lock hash, KEYS[2]
-- lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index, KEYS[4] queue list,
-- KEYS[5] timeout zset. {{SLACK_MS}}: how long the line outlives its last deadline.

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Drop the waiters first in line whose deadline has passed (or that have none); how many,
-- and the waiter first in line then (nil: nobody waits).
local function prune()
  local n = 0
  while true do
    local head = redis.call('lindex', KEYS[4], 0)
    if not head then return n, nil end
    local s = tonumber(redis.call('zscore', KEYS[5], head))
    if s and s > now then return n, head end
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], head)
    n = n + 1
  end
end
-- The line lives until its last deadline (plus the slack): by then every waiter in it is one
-- prune() drops, so a line whose waiters all died goes by itself, with nobody taking the lock
-- again. Run by every script that leaves anyone in line (a line just emptied is gone already).
local function keep()
  local last = redis.call('zrange', KEYS[5], -1, -1, 'WITHSCORES')
  if not last[2] then return end
  local at = math.max(now, math.ceil(tonumber(last[2]))) + {{SLACK_MS}}
  redis.call('pexpireat', KEYS[4], at)
  redis.call('pexpireat', KEYS[5], at)
end
-- Wake `head`, the waiter first in line (nil: nobody), on its own channel.
local function notify(msg, head)
  if head then redis.call('publish', KEYS[2] .. ':' .. head, msg) end
end
