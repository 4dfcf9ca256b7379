-- Snippet: what every fair-lock script starts with: `now` (server time, ms), `prune()`,
-- `keep(ours)`, `notify(msg, head)`, `own(owner)`, `proc(owner)`, `watch(msg, head, caller)`
-- and `begin(msg, head, caller, v)`. Every
-- fair-lock script takes KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':'
-- .. owner), KEYS[3] index, KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters
-- (hash owner -> 0, or the end of its turn, ms). {{SLACK_MS}}: how long the line outlives its
-- last deadline; {{TURN_MS}}: how long a waiter of ours has to take the lock once its turn began.

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
    redis.call('hdel', KEYS[6], head)
    n = n + 1
  end
end
-- The line lives until its last deadline (plus the slack): by then every waiter in it is one
-- prune() drops, so a line whose waiters all died goes by itself, with nobody taking the lock
-- again. Run by every script that leaves anyone in line (a line just emptied is gone already).
-- `ours`: the script wrote a waiter of ours into KEYS[6], which then lives as long (deadlines
-- only ever move down, so it outlives every waiter of ours in it).
local function keep(ours)
  local last = redis.call('zrange', KEYS[5], -1, -1, 'WITHSCORES')
  if not last[2] then return end
  local at = math.max(now, math.ceil(tonumber(last[2]))) + {{SLACK_MS}}
  redis.call('pexpireat', KEYS[4], at)
  redis.call('pexpireat', KEYS[5], at)
  if ours then redis.call('pexpireat', KEYS[6], at) end
end
-- Wake `head`, the waiter first in line (nil: nobody), on its own channel.
local function notify(msg, head)
  if head then redis.call('publish', KEYS[2] .. ':' .. head, msg) end
end
-- nil: `owner` is not ours (a Redisson client's: its deadline alone counts); 0: ours, its
-- turn not begun; else when its turn ends.
local function own(owner)
  return tonumber(redis.call('hget', KEYS[6], owner))
end
-- The process of `owner` (`<uuid>:<n>`, ours and Redisson's alike): its uuid.
local function proc(owner)
  return string.match(owner, '^(.*):')
end
-- Wake the first waiter behind `head` of another process than head's (a dead process's
-- waiters all died with it), unless it is `caller`: it parks until head's turn ends, then
-- drops the head if it is still there. Looked for 16 places at a time, up to 1,024
-- places (a process of many threads may fill the line: one LRANGE in the common case).
local function watch(msg, head, caller)
  local p = proc(head)
  local from = 1
  while from <= 1024 do
    local behind = redis.call('lrange', KEYS[4], from, from + 15)
    for i = 1, #behind do
      if proc(behind[i]) ~= p then
        if behind[i] ~= caller then notify(msg, behind[i]) end
        return
      end
    end
    if #behind < 16 then return end
    from = from + 16
  end
end
-- The lock is free and `head` first in line, `v` its own(): begin its turn, if it is ours and
-- none is under way (a lapsed one, the lock taken by someone else since, begins anew), and
-- wake its watcher (`watch`). True if begun (the caller wakes `head`).
local function begin(msg, head, caller, v)
  if not head or not v or v > now then return false end
  redis.call('hset', KEYS[6], head, now + {{TURN_MS}})
  watch(msg, head, caller)
  return true
end
