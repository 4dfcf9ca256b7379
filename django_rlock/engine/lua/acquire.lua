-- RLock's acquire (and every lock kind's that hands off: a waiter registers in the line).
-- KEYS[1] lock hash, KEYS[2] index, KEYS[3] hand-off queue, KEYS[4] hand-off waiters (3 and 4
-- only with a token).
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] holder info (the index entry as written,
-- restamped with the server's TIME: `stamped`), ARGV[4] mode: "" (a reentrant
-- first attempt), "fresh" (a first attempt by an owner that holds nothing as far as its
-- process knows: a field of its already there is a grant nobody took, taken as a new hold at
-- count 1, never counted on top) or "claim" (a waiter's retry), ARGV[5] token (a waiter:
-- registered if the attempt fails), ARGV[6] its budget ms (-1: none), ARGV[7] slack ms past
-- the holder's PTTL, ARGV[8] grant lease ms.
-- Reply: nil = acquired (new or reentrant); {{CLAIMED}} = scripts.CLAIMED (claim mode: the
-- owner was granted the lock meanwhile and holds it already: nothing is counted twice; the
-- grant's short lease is now the full one); else the holder's PTTL (-1: no expiry), and the
-- waiter is registered: queued once per token, its entry valid until its budget ends or the
-- holder's PTTL plus the slack has passed (it re-registers on every retry), its holder info
-- stamped with the server's TIME of the first registration (listing: waiting since).

if ARGV[4] == 'claim' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {{CLAIMED}}
end
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  -- #include now_ms
  -- #include stamped
  redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))
  if ARGV[4] == 'claim' and KEYS[4] then
    redis.call('hdel', KEYS[4], ARGV[5], '=' .. ARGV[2])
  end
  return nil
end
-- (a claim found no field of ours above: no second look)
if ARGV[4] ~= 'claim' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[4] == 'fresh' then
    redis.call('hset', KEYS[1], ARGV[2], 1)
  else
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
  end
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
local ttl = redis.call('pttl', KEYS[1])
if ARGV[5] then
  -- #include now_ms
  local valid = ttl
  if valid < 0 then valid = 60000 end
  valid = valid + tonumber(ARGV[7])
  local budget = tonumber(ARGV[6])
  if budget >= 0 and budget < valid then valid = budget end
  -- #include stamped
  -- waiting since: the server's TIME of the wait's first registration, kept by the next ones
  local old = redis.call('hget', KEYS[4], ARGV[5])
  local body = nil
  local n = 0
  if old then
    local a = string.find(old, ' ', 1, true)
    local b = a and string.find(old, ' ', a + 1, true)
    if b and tonumber(string.sub(old, 1, a - 1)) > now then body = string.sub(old, b + 1) end
  else
    n = redis.call('rpush', KEYS[3], ARGV[5])
  end
  local entry = (now + valid) .. ' ' .. ARGV[8] .. ' ' .. (body or stamped(ARGV[3], now))
  redis.call('hset', KEYS[4], ARGV[5], entry)
  -- #include keep_line
  keep_line(KEYS[3], KEYS[4], valid, n)
end
return ttl
