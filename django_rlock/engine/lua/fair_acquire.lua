-- FairLock's acquire: queues the caller (Redisson's deadline math) unless it gets the lock.
-- KEYS[1] lock hash, KEYS[2] lock channel (a waiter's is KEYS[2] .. ':' .. owner), KEYS[3] index,
-- KEYS[4] queue list, KEYS[5] timeout zset, KEYS[6] our waiters.
-- ARGV[1] lease ms, ARGV[2] owner, ARGV[3] holder info, ARGV[4] allowance ms (0: the no-wait
-- variant, which never queues), ARGV[5] message.
-- Reply: nil = acquired (new or reentrant); else how long (ms) the caller may park at most:
-- the holder's PTTL (-1: no expiry), or, the lock being free with another waiter first in
-- line, that waiter's time left (its deadline, or the end of its turn if it is ours; capped
-- by the caller's lease).
-- A line left behind expires at its last deadline plus the slack (`keep`); with nobody in
-- line (the uncontended path) the queue costs one LINDEX. A waiter that joins is marked ours
-- (KEYS[6]); the lock free with another first in line, a head of ours whose turn is over is
-- dropped (with the waiters of ours of its process right behind it) and the new head's turn
-- begun (`begin`).

-- #include fair

local pruned, head = prune()
local free = redis.call('exists', KEYS[1]) == 0
local turn = nil
if free and head and head ~= ARGV[2] then
  -- Heads of ours whose turn ended without taking the lock: dead (or frozen). Dropped, and
  -- with each the waiters of ours of its process right behind it (they died with it).
  local gone = nil
  while head and head ~= ARGV[2] do
    turn = own(head)
    local lapsed = turn and turn ~= 0 and turn <= now
    local with_it = turn == 0 and gone ~= nil and proc(head) == gone
    if not (lapsed or with_it) then break end
    gone = proc(head)
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], head)
    redis.call('hdel', KEYS[6], head)
    -- Told, in case it lives (a frozen loop's head takes a live thread of its process along):
    -- it asks again at once and queues at the back, instead of at its park bound.
    notify(ARGV[5], head)
    local more
    more, head = prune()
    pruned = pruned + 1 + more
    turn = nil
  end
end
if free and (not head or head == ARGV[2]) then
  if head then
    redis.call('lpop', KEYS[4])
    redis.call('zrem', KEYS[5], ARGV[2])
    redis.call('hdel', KEYS[6], ARGV[2])
    local wait = tonumber(ARGV[4])
    if wait > 0 then
      local rest = redis.call('zrange', KEYS[5], 0, -1)
      for i = 1, #rest do redis.call('zincrby', KEYS[5], -wait, rest[i]) end
    end
    keep()
  end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include stamped
  redis.call('hset', KEYS[3], KEYS[1], stamped(ARGV[3], now))
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  if head then keep() end
  return nil
end
if free and head then
  if begin(ARGV[5], head, ARGV[2], turn) then
    turn = now + {{TURN_MS}}
    notify(ARGV[5], head)
  elseif pruned > 0 then
    notify(ARGV[5], head)
  end
end
local pttl = redis.call('pttl', KEYS[1])
local wait = tonumber(ARGV[4])
if wait == 0 then
  if head then keep() end
  return math.max(0, pttl)
end
local joined = false
if not redis.call('zscore', KEYS[5], ARGV[2]) then
  local last = redis.call('lindex', KEYS[4], -1)
  local base = last and tonumber(redis.call('zscore', KEYS[5], last))
  if not base then base = now + math.max(0, pttl) end
  if redis.call('zadd', KEYS[5], base + wait, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[4], ARGV[2])
    redis.call('hset', KEYS[6], ARGV[2], 0)
    joined = true
  end
end
keep(joined)
if free then
  local s = tonumber(redis.call('zscore', KEYS[5], head)) or now
  if turn and turn > now then s = math.min(s, turn) end
  return math.max(0, math.min(s - now, tonumber(ARGV[1])))
end
return pttl
