-- Snippet: the tail of a waiter's attempt (``waiters.noting``): the kind's own script ran as
-- `attempt` and replied `reply`; the caller's waiter record in KEYS[nk + 1] (``naming``'s
-- waiting hash of the key) is written while it still waits and removed once it does not.
-- ARGV[na + 1] token, [na + 2] budget ms left (-1: none), [na + 3] longest park without an
-- attempt (ms), [na + 4] slack ms, [na + 5] holder info (``identity``, as an index entry).
-- {{WAITING}}: a Lua test of `reply` (still waiting); {{TTL}}: the ms the reply says the
-- wait may last before the next attempt (nil or < 0: none).
-- A record is "<deadline ms> 0 <info stamped with the server's TIME of its first write>":
-- a re-write keeps the stamp (waiting since), and a record past its deadline is a new wait.

local wkey, wtoken = KEYS[nk + 1], ARGV[na + 1]
if {{WAITING}} then
  -- #include now_ms
  -- #include stamped
  local valid = tonumber(ARGV[na + 3])
  local ttl = {{TTL}}
  if ttl and ttl >= 0 and ttl < valid then valid = ttl end
  valid = valid + tonumber(ARGV[na + 4])
  local budget = tonumber(ARGV[na + 2])
  if budget >= 0 and budget < valid then valid = budget end
  local old = redis.call('hget', wkey, wtoken)
  local body = nil
  if old then
    local a = string.find(old, ' ', 1, true)
    local b = a and string.find(old, ' ', a + 1, true)
    if b and tonumber(string.sub(old, 1, a - 1)) > now then body = string.sub(old, b + 1) end
  elseif redis.call('hlen', wkey) >= 32 then
    -- a new waiter prunes the records of those that died or gave up (bounded by the hash)
    local all = redis.call('hgetall', wkey)
    for i = 1, #all, 2 do
      local a = string.find(all[i + 1], ' ', 1, true)
      if not a or (tonumber(string.sub(all[i + 1], 1, a - 1)) or 0) <= now then
        redis.call('hdel', wkey, all[i])
      end
    end
  end
  if not body then body = stamped(ARGV[na + 5], now) end
  redis.call('hset', wkey, wtoken, (now + valid) .. ' 0 ' .. body)
  if redis.call('pttl', wkey) < valid then redis.call('pexpire', wkey, valid) end
else
  redis.call('hdel', wkey, wtoken)
end
return reply
