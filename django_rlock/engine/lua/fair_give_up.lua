-- Redisson's acquireFailed: a fair-lock waiter gives up (budget spent, error, cancelled).
-- Everyone behind it moves up by its allowance; if it was first in line and the lock is free,
-- the new head is woken (its turn begun if it is ours). The line left expires at its (new)
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
end
if #q > 1 then keep() end
notify(ARGV[3], head)
return 1
