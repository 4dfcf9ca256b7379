-- Redisson's acquireFailed: a fair-lock waiter gives up (budget spent, error, cancelled).
-- Everyone behind it moves up by its allowance; if it was first in line and the lock is free,
-- the new head is woken (its turn begun if it is ours); if it was behind a head of ours whose
-- turn is under way, the next waiter of another process watches that turn instead. The line left expires at its (new)
-- last deadline plus the slack.
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters.
-- ARGV[1] owner, ARGV[2] its allowance ms, ARGV[3] message.
-- Reply: 1 left, 0 not queued.

-- #include fair

local q = redis.call('lrange', KEYS[4], 0, -1)
local i = 1
while i <= #q and q[i] ~= ARGV[1] do i = i + 1 end
redis.call('zrem', KEYS[5], ARGV[1])
redis.call('hdel', KEYS[6], ARGV[1])
if i > #q then
  if #q > 0 then keep() end
  return 0
end
for j = i + 1, #q do redis.call('zincrby', KEYS[5], -tonumber(ARGV[2]), q[j]) end
redis.call('lrem', KEYS[4], 0, ARGV[1])
local head = nil
if i == 1 and redis.call('exists', KEYS[1]) == 0 then
  head = redis.call('lindex', KEYS[4], 0)
  if head then begin(ARGV[3], head, nil, own(head)) end
elseif i > 1 and proc(ARGV[1]) ~= proc(q[1]) and redis.call('exists', KEYS[1]) == 0 then
  -- The head's turn is under way and the one leaving may have been its watcher (woken to
  -- drop the head if the turn lapses): the next one watches, or nobody would look before
  -- its own park bound (the holder's PTTL when it last asked: up to a lease).
  local v = own(q[1])
  if v and v > now then watch(ARGV[3], q[1], nil) end
end
if #q > 1 then keep() end
notify(ARGV[3], head)
return 1
