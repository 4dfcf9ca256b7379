-- Snippet: a rate limiter's state, Redisson's RRateLimiter layout (OVERALL mode), brought up to
-- the server's clock. Scripts that include it take KEYS[1] the limiter hash (`rate`,
-- `interval` in ms, `type`, `keepAliveTime`), KEYS[2] `{key}:value` (permits left),
-- KEYS[3] `{key}:permits` (zset of grants: member struct.pack('Bc0I', #id, id, permits),
-- score = the grant's server time in ms), KEYS[4] `{key}:rlock_line` (zset of waiters:
-- "<token>|<permits>" -> arrival in us), KEYS[5] `{key}:rlock_line_timeout` (the same
-- members -> the ms after which the waiter is dropped).
--
-- Scores are ms with the microseconds as a fraction (Redisson's clients write whole ms; both
-- read alike). A grant scored S counts while now <= S + interval, so no interval (closed at
-- both ends) ever holds more than `rate` permits; Redisson frees it at now = S + interval
-- already. Numbers go to Redis through `ms()`: Lua would write them with 14 digits.

local t = redis.call('time')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = now_us / 1000

local function ms(x) return string.format('%.3f', x) end

local function permits_of(members)
  local n = 0
  for _, m in ipairs(members) do
    local _, p = struct.unpack('Bc0I', m)
    n = n + p
  end
  return n
end

-- rate, interval (ms); or nil and -1 (no rate set) / -2 (not OVERALL: PER_CLIENT).
local function rate_conf()
  local c = redis.call('hmget', KEYS[1], 'rate', 'interval', 'type')
  if not c[1] or not c[2] then return nil, -1 end
  if c[3] and c[3] ~= '0' then return nil, -2 end
  return tonumber(c[1]), tonumber(c[2])
end

-- Redisson's expiry rule: keepAliveTime > 0 sets every key's TTL to it; else the keys follow
-- the hash's own TTL if it has one.
local function rate_touch()
  local keep = tonumber(redis.call('hget', KEYS[1], 'keepAliveTime') or '0') or 0
  if keep > 0 then
    redis.call('pexpire', KEYS[1], keep)
    redis.call('pexpire', KEYS[2], keep)
    redis.call('pexpire', KEYS[3], keep)
  else
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
      redis.call('pexpire', KEYS[2], ttl)
      redis.call('pexpire', KEYS[3], ttl)
    end
  end
end

-- The permits left now (may be < 0 after the rate was lowered). With `write`, expired grants
-- are dropped and the counter stored. A counter that is missing or out of step (above the
-- rate) is recounted from the grants in the window, where Redisson would reset it to `rate`.
local function rate_available(rate, interval, write)
  local edge = '(' .. ms(now_ms - interval)
  local expired = redis.call('zrangebyscore', KEYS[3], '-inf', edge)
  local value = redis.call('get', KEYS[2])
  local available = value and (tonumber(value) + permits_of(expired))
  if not available or available > rate then
    local live = redis.call('zrangebyscore', KEYS[3], ms(now_ms - interval), '+inf')
    available = rate - permits_of(live)
  end
  if write and (#expired > 0 or not value or tonumber(value) ~= available) then
    if #expired > 0 then redis.call('zremrangebyscore', KEYS[3], '-inf', edge) end
    redis.call('set', KEYS[2], available, 'KEEPTTL')
    if not value then rate_touch() end  -- a new counter gets the others' TTL
  end
  return available
end

-- The permits asked for by the live waiters ahead of `member` (all of them if it is not in
-- line). With `write`, waiters past their deadline are dropped first.
local function rate_ahead(member, write)
  local dead = redis.call('zrangebyscore', KEYS[5], '-inf', '(' .. ms(now_ms))
  local gone = {}
  for _, w in ipairs(dead) do
    gone[w] = true
    if write then
      redis.call('zrem', KEYS[4], w)
      redis.call('zrem', KEYS[5], w)
    end
  end
  local ahead = 0
  for _, w in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do
    if w == member then break end
    if not gone[w] then ahead = ahead + tonumber(string.match(w, '|(%d+)$')) end
  end
  return ahead
end

-- Microseconds until a caller whose last permit is the `pos`-th to be handed out (the permits
-- asked for by the waiters ahead, plus its own) could have it (+2 us: a grant frees just
-- *after* its interval), if every permit is taken as soon as it frees: the permits free now
-- come first, then the window's grants as they expire (walked from the oldest), then the same
-- again an interval later for each full round of `rate`. A grant of a later round is not made
-- yet: its taker wakes a little late, so each round adds {{LATE_MS}} ms, or the waiter
-- counting on it would wake too soon and need one more attempt.
local function rate_wait(rate, interval, available, pos)
  local a = math.max(available, 0)
  local round = math.floor((pos - 1) / rate)
  local r = (pos - 1) % rate
  if r < a then
    if round == 0 then return 0 end
    return (now_ms + round * (interval + {{LATE_MS}})) * 1000 + 2 - now_us
  end
  local need = r - a + 1
  local got = redis.call('zrangebyscore', KEYS[3], ms(now_ms - interval), '+inf',
                         'withscores', 'limit', 0, need)
  local freed = 0
  for i = 1, #got, 2 do
    local _, p = struct.unpack('Bc0I', got[i])
    freed = freed + p
    if freed >= need then
      return (tonumber(got[i + 1]) + interval + round * (interval + {{LATE_MS}})) * 1000 + 2
             - now_us
    end
  end
  return (now_ms + (round + 1) * (interval + {{LATE_MS}})) * 1000 + 2 - now_us
end
