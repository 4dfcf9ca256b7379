-- RateLimiter's attempt: take ARGV[1] permits if the window has them and no live waiter ahead
-- asks for them first; otherwise say how long until it could, and (a waiter) keep a place in line.
-- KEYS[1..5] as in _rate.lua, KEYS[6] the index.
-- ARGV[1] permits, ARGV[2] grant id (ASCII, random), ARGV[3] waiter token ('' = no line),
-- ARGV[4] budget in ms (-1 = none), ARGV[5] how long a waiter's place outlives its wait (ms),
-- ARGV[6] longest wait a place is kept for before the waiter re-checks (ms), ARGV[7] the rate
-- to set if none is ('' = none: refuse), ARGV[8] its interval (ms), ARGV[9] its keepAliveTime.
-- Reply: {code, x, available, rate, interval ms, id}:
--   1 granted: x = the grant's server time (us), id = the grant's id (ARGV[2], or made unique);
--   0 refused: x = us until it could be had (a waiter is in line for it);
--   2 refused, and not within the budget: x as for 0, the waiter is out of line;
--  -1 no rate set, -2 not an OVERALL limiter (PER_CLIENT), -3 permits above the rate.

-- #include rate

if ARGV[7] ~= '' and redis.call('hexists', KEYS[1], 'rate') == 0 then
  redis.call('hset', KEYS[1], 'rate', ARGV[7], 'interval', ARGV[8], 'type', '0',
             'keepAliveTime', ARGV[9])
  redis.call('hsetnx', KEYS[6], KEYS[1],
             t[1] .. '.' .. string.format('%06d', tonumber(t[2])) .. ' {"kind":"rate"}')
  rate_touch()
end
local rate, interval = rate_conf()
if not rate then return {interval, 0, 0, 0, 0, ''} end
local n = tonumber(ARGV[1])
if n > rate then return {-3, 0, 0, rate, interval, ''} end
local member = false
if ARGV[3] ~= '' then member = ARGV[3] .. '|' .. ARGV[1] end
local available = rate_available(rate, interval, true)
local ahead = rate_ahead(member, true)
if available - ahead >= n then
  local id = ARGV[2]
  local grant = struct.pack('Bc0I', string.len(id), id, n)
  local k = 0
  while redis.call('zscore', KEYS[3], grant) do
    -- The same id twice (Redisson's ZADD would overwrite, losing a grant): made unique.
    k = k + 1
    id = ARGV[2] .. '.' .. k
    grant = struct.pack('Bc0I', string.len(id), id, n)
  end
  redis.call('zadd', KEYS[3], ms(now_ms), grant)
  redis.call('set', KEYS[2], available - n, 'KEEPTTL')
  if member then
    redis.call('zrem', KEYS[4], member)
    redis.call('zrem', KEYS[5], member)
  end
  rate_touch()
  return {1, now_us, available - n, rate, interval, id}
end
local wait = rate_wait(rate, interval, available, ahead + n)
local budget = tonumber(ARGV[4])
if budget >= 0 and wait > budget * 1000 then
  if member then
    redis.call('zrem', KEYS[4], member)
    redis.call('zrem', KEYS[5], member)
  end
  return {2, wait, available, rate, interval, ''}
end
if member then
  local keep = tonumber(ARGV[5])
  local recheck = tonumber(ARGV[6])
  redis.call('zadd', KEYS[4], 'NX', ms(now_us), member)
  redis.call('zadd', KEYS[5], ms(now_ms + math.min(math.ceil(wait / 1000), recheck) + keep),
             member)
  redis.call('pexpire', KEYS[4], recheck + keep + 1000)
  redis.call('pexpire', KEYS[5], recheck + keep + 1000)
end
return {0, wait, available, rate, interval, ''}
